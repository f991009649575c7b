"""The DataLoader subclasses that make or iterate themselves (their own `__init__` or `__iter__`, which may never
call torch's: torchdata's StatefulDataLoader does neither): each one's hooked as torch's are, those defined already
when the hooks go in and those defined while they are in (torch's DataLoader's `__init_subclass__`), and all put
back with torch's. An `__iter__` that goes on to its base's is left alone: the base's hook watches it, with torch's
iterator under it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data.dataloader import DataLoader as TorchDataLoader

Method = Callable[..., Any]
HookOf = Callable[[Method], Method]  # the hook that stands in for a method, made from it


class SubclassHooks:
    """The subclasses' own `__init__` and `__iter__`, hooked: (class, name) -> (the original, its hook)."""

    def __init__(self) -> None:
        self._hooked: dict[tuple[type, str], tuple[Method, Method]] = {}
        self._hooks: dict[str, HookOf] = {}
        self._init_subclass: Any = None
        self._ours: Any = None

    def install(self, *, init_hook_of: HookOf, iter_hook_of: HookOf) -> None:
        """Hook every subclass's own methods, now and as subclasses are defined."""
        self._hooks = {"__init__": init_hook_of, "__iter__": iter_hook_of}
        for cls in _subclasses(TorchDataLoader):
            self._hook(cls)
        hooks = self
        before = self._init_subclass = TorchDataLoader.__dict__.get("__init_subclass__")

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            if before is not None:  # the one in place before (the job's startup hook's), as it would have run
                before.__get__(None, cls)(**kwargs)
            else:
                super(TorchDataLoader, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
            if hooks._hooks:
                hooks._hook(cls)

        self._ours = classmethod(__init_subclass__)
        TorchDataLoader.__init_subclass__ = self._ours  # type: ignore[assignment]

    def _hook(self, cls: type) -> None:
        for name, hook_of in self._hooks.items():
            original = cls.__dict__.get(name)
            if original is None or (cls, name) in self._hooked or not callable(original):
                continue
            if name == "__iter__" and _passes_on(original):
                continue  # its base's __iter__ (torch's, or a hooked one) is the watch's: accelerate's, litdata's
            hook = hook_of(original)
            hook.__wrapped__ = original  # type: ignore[attr-defined]
            self._hooked[(cls, name)] = (original, hook)
            setattr(cls, name, hook)

    def outermost_iter(self, loader: Any, default: Method) -> Method:
        """The original `__iter__` that `loader` runs first (its class's own, or a base's below torch's); `default`
        (torch's) when none is hooked. A hook of another is inside it: that one passes the loader on."""
        for klass in type(loader).__mro__:
            if klass is TorchDataLoader:
                break
            hooked = self._hooked.get((klass, "__iter__"))
            if hooked is not None:
                return hooked[0]
        return default

    def uninstall(self) -> None:
        """Put every method back (one replaced since by another hook keeps that: ours passes on)."""
        self._hooks = {}
        for (cls, name), (original, hook) in self._hooked.items():
            if cls.__dict__.get(name) is hook:
                setattr(cls, name, original)
        self._hooked = {}
        if TorchDataLoader.__dict__.get("__init_subclass__") is not self._ours:
            return  # another was set since: it stays, and ours (which chains) with it
        if self._init_subclass is None:
            del TorchDataLoader.__init_subclass__
        else:
            TorchDataLoader.__init_subclass__ = self._init_subclass


def _passes_on(method: Method) -> bool:
    """Whether an `__iter__` goes on to its base's (`super().__iter__()`, or a base's named): a generator that
    yields the batches of torch's iterator (accelerate's DataLoaderShard) is watched through torch's."""
    code = getattr(method, "__code__", None)
    return code is None or "super" in code.co_names or "__iter__" in code.co_names


def _subclasses(cls: type) -> list[type]:
    found, todo = [], list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        if sub not in found:
            found.append(sub)
            todo.extend(sub.__subclasses__())
    return found
