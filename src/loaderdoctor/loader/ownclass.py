"""A DataLoader of the user's own class (torchdata's StatefulDataLoader, litdata's StreamingDataLoader, a subclass
of theirs) rebuilt as that class: the arguments its constructor takes beyond torch's, read back from the loader
where it keeps them under their names. A class that cannot be rebuilt so (an argument kept under another name, or
torch's arguments not taken) says why."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

_TORCH_ARGUMENTS = frozenset(inspect.signature(DataLoader.__init__).parameters) - {"self"}
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@dataclass(frozen=True)
class OwnClass:
    """How to make a loader of the user's class: the class (one that takes every argument of torch's DataLoader,
    by name or through **kwargs) and its own arguments (name -> the loader's value)."""

    cls: type = DataLoader
    own: dict[str, Any] = field(default_factory=dict)

    def make(self, dataset: Any, **kwargs: Any) -> Any:
        """A loader of the class over `dataset` with torch's `kwargs` and its own arguments."""
        return self.cls(dataset, **kwargs, **self.own)


def own_class(loader: Any) -> tuple[OwnClass, str | None]:
    """How to rebuild `loader` as its own class, and None; or torch's DataLoader and why its class cannot be."""
    cls = type(loader)
    if cls is DataLoader or cls.__module__.split(".")[0] == "loaderdoctor":
        return OwnClass(), None
    name = f"{cls.__module__}.{cls.__qualname__}"
    try:
        parameters = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError) as error:
        return OwnClass(), f"{name}'s constructor does not say its arguments ({error})"
    own: dict[str, Any] = {}
    for argument, parameter in list(parameters.items())[1:]:  # after self
        if argument in _TORCH_ARGUMENTS or parameter.kind in _VARIADIC:
            continue
        kept = next((key for key in (argument, f"_{argument}") if key in vars(loader)), None)
        if kept is not None:
            own[argument] = vars(loader)[kept]
        elif parameter.default is inspect.Parameter.empty:
            return OwnClass(), f"{name} takes {argument!r}, which the loader keeps under no name of that word"
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return OwnClass(cls, own), None
    missing = sorted(_TORCH_ARGUMENTS - set(parameters))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        return OwnClass(), f"{name} does not take torch's DataLoader arguments {shown}"
    return OwnClass(cls, own), None
