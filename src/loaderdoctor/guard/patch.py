"""patch(): every torch.utils.data.DataLoader made from then on is guarded, process-wide, until unpatch().

How: while patched, the name `torch.utils.data.DataLoader` holds PatchedDataLoader, a subclass of torch's class
whose metaclass makes calling it return a GuardedLoader, and makes isinstance()/issubclass() against it answer
True for torch's DataLoaders (made before, or by code that holds torch's class) and for GuardedLoaders. A factory
function in its place would break every isinstance(x, torch.utils.data.DataLoader) and every subclass written
while patched; a GuardedLoader that claims torch's class as its __class__ would fool type(), pickle and copy.

Only that one name changes. torch.utils.data.dataloader.DataLoader, where the class is defined, keeps naming it:
pickle finds DataLoader instances under that name, and code that needs an unguarded loader while patched can
call it. The guard itself builds its internal loaders with torch's class, which its modules bound at import,
before patch() could run: a guarded loader never builds a patched one.
"""

from __future__ import annotations

import abc
import contextlib
import inspect
import logging
import threading
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import torch.utils.data
from torch.utils.data.dataloader import DataLoader as TorchDataLoader

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.guard.batchplan import check_resumable
from loaderdoctor.guard.compat import unguardable
from loaderdoctor.guard.loader import GuardedLoader

__all__ = ["PatchedDataLoader", "is_patched", "patch", "patched", "unpatch"]

log = logging.getLogger("loaderdoctor")

_T_co = TypeVar("_T_co", covariant=True)


class _State:
    """What patch(), unpatch() and patched() share, changed only under `lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outside: Mapping[str, Any] | None = None  # patch()'s options; None after unpatch()
        self.blocks: list[tuple[object, Mapping[str, Any]]] = []  # the open patched() blocks, innermost last
        # The options loaders are guarded with now. PatchedDataLoader reads it without the lock: it is replaced,
        # never changed in place.
        self.in_force: Mapping[str, Any] | None = None


_state = _State()


def _make(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch's DataLoader made from the user's arguments, guarded with the options in force (when any are)."""
    options = _state.in_force
    loader = TorchDataLoader(*args, **kwargs)
    if options is None:
        return loader  # the class was kept (e.g. `from torch.utils.data import DataLoader`) past unpatch()
    if unguardable(stacklevel=3):  # the user's DataLoader(...) line
        return loader  # a torch whose internals the guard cannot use: plain, said once per process
    # An explicit DataLoader(persistent_workers=...) wins over patch()'s, as with loaderdoctor.DataLoader.
    persistent_workers = kwargs.get("persistent_workers", options.get("persistent_workers"))
    try:
        check_resumable(loader)
        # The options were checked by patch(); what remains is whether they fit this loader (on_sample_error="skip"
        # over an IterableDataset does not).
        return GuardedLoader(loader, **{**options, "persistent_workers": persistent_workers})
    except UsageError as error:
        # Process-wide, the guard must not break a loader it cannot protect: this one runs as it would unpatched,
        # said in the log (a warning would fail the user's code under -W error, as pytest's filterwarnings runs it).
        log.warning("loaderdoctor.patch(): this DataLoader is not guarded: %s", error.message)
        return loader


class _PatchedMeta(abc.ABCMeta):
    """Makes PatchedDataLoader stand in for torch's class: calling it guards, isinstance() and issubclass()
    answer as they do for torch's class (and for GuardedLoader), and a class derived from it derives from
    torch's. ABCMeta, so that `class MyLoader(DataLoader, abc.ABC)` has no metaclass conflict."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> type:
        if not any(isinstance(base, _PatchedMeta) for base in bases):
            return super().__new__(mcls, name, bases, namespace, **kwargs)
        # `class MyLoader(DataLoader)` written while patched: derived from torch's class instead, it is made and
        # behaves exactly as unpatched (unguarded), and keeps no trace of the patch after unpatch().
        bases = tuple(TorchDataLoader if isinstance(base, _PatchedMeta) else base for base in bases)
        metaclass, _, kwargs = types.prepare_class(name, bases, kwargs)
        return metaclass(name, bases, namespace, **kwargs)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return _make(args, kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, (TorchDataLoader, GuardedLoader))

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, (TorchDataLoader, GuardedLoader))


class PatchedDataLoader(TorchDataLoader[_T_co], metaclass=_PatchedMeta):
    """torch.utils.data.DataLoader while loaderdoctor.patch() is in force: DataLoader(...) takes torch's
    arguments and returns a GuardedLoader of torch's DataLoader made from them (a plain one once unpatched).
    isinstance(x, DataLoader) is True for torch's DataLoaders and for GuardedLoaders."""

    __signature__ = inspect.signature(TorchDataLoader)  # help() and argument-parsing libraries see torch's


def _checked(options: dict[str, Any]) -> Mapping[str, Any]:
    """`options`, read-only, once the guard accepts them: a mistake is a UsageError now, not at some DataLoader."""
    parameters = inspect.signature(GuardedLoader).parameters.values()
    known = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(known))
    if unknown:
        options_word = "option" if len(unknown) == 1 else "options"
        raise UsageError(
            f"unknown guard {options_word} for patch(): {', '.join(unknown)}", hint=f"use {', '.join(known)}"
        )
    GuardedLoader(TorchDataLoader([0]), **options).close()  # the guard's own checks of the values
    return types.MappingProxyType(dict(options))


def _check_installable() -> None:
    installed = torch.utils.data.DataLoader
    if installed is not TorchDataLoader and installed is not PatchedDataLoader:
        raise UsageError(
            f"torch.utils.data.DataLoader was replaced by {installed!r}, not by loaderdoctor: patch() leaves it so",
            hint="undo the other patch first, or guard loaders one by one with loaderdoctor.guard(loader)",
        )


def _describe(options: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in options.items()) or "the default options"


def _settle() -> None:
    """Under the lock: torch's name and the options in force as the innermost open block, else patch(), says."""
    options = _state.blocks[-1][1] if _state.blocks else _state.outside
    installed = torch.utils.data.DataLoader
    if options is None:
        _state.in_force = None
        if installed is PatchedDataLoader:
            torch.utils.data.DataLoader = TorchDataLoader
            log.info("loaderdoctor: torch.utils.data.DataLoader restored; DataLoaders made from now on are not guarded")
        elif installed is not TorchDataLoader:
            warnings.warn(
                f"loaderdoctor.unpatch(): torch.utils.data.DataLoader was replaced by {installed!r} after patch(), "
                "so it is left as it is; no DataLoader is guarded from now on",
                LoaderDoctorWarning,
                stacklevel=3,
            )
        return
    if installed is not PatchedDataLoader:
        torch.utils.data.DataLoader = PatchedDataLoader
        log.info(
            "loaderdoctor: torch.utils.data.DataLoader patched: DataLoaders made from now on are guarded (%s)",
            _describe(options),
        )
    elif options != _state.in_force:
        log.info("loaderdoctor: DataLoaders made from now on are guarded with %s", _describe(options))
    _state.in_force = options


def patch(**options: Any) -> None:
    """Guard every torch.utils.data.DataLoader made from now on, with guard()'s options, until unpatch().

    `torch.utils.data.DataLoader(...)` then returns a GuardedLoader: the same batches in the same order, the
    same len(), the loader's attributes read through; and isinstance(x, torch.utils.data.DataLoader) holds for
    it and for plain DataLoaders. An explicit DataLoader(persistent_workers=...) wins over the option.

    Not affected: code that bound the class before patch() (`from torch.utils.data import DataLoader` at the
    top of a module imported earlier: most libraries) holds torch's class and makes plain loaders, and
    isinstance(guarded, that class) is False; torch.utils.data.dataloader.DataLoader, left as torch's class
    for loaders that must stay plain; subclasses of DataLoader (class MyLoader(DataLoader)), written before or
    while patched, whose instances are made as the user's code says, unguarded. A loader the guard cannot
    resume (an IterableDataset without state_dict()/load_state_dict()), or whose dataset the options do not fit
    (on_sample_error="skip" for an IterableDataset), is left plain, with a LoaderDoctorWarning; an IterableDataset
    that offers both is guarded.

    Calling patch() again replaces the options for loaders made afterwards (those made already keep theirs);
    one unpatch() undoes it. Bad options raise a UsageError here, and torch is left as it was. Thread-safe.
    """
    checked = _checked(options)
    with _state.lock:
        _check_installable()
        _state.outside = checked
        _settle()


def unpatch() -> None:
    """Make torch.utils.data.DataLoader torch's class again, and close every patched() block still open.

    Loaders guarded already stay guarded; a patched class some code bound while patched makes plain loaders
    from now on. Without a patch in force, nothing happens. Thread-safe.
    """
    with _state.lock:
        _state.outside = None
        _state.blocks.clear()
        _settle()


@contextlib.contextmanager
def patched(**options: Any) -> Iterator[None]:
    """Within the block, guard every torch.utils.data.DataLoader made (see patch()) with these options; after
    it, whatever applied without the block applies again (patch()'s options, or no patch).

    Blocks nest, and blocks of several threads may overlap: the options in force are those of the block
    opened last of those still open; when none is, patch()'s. unpatch() inside a block ends the patch for good.
    """
    checked = _checked(options)
    token = object()
    with _state.lock:
        _check_installable()
        _state.blocks.append((token, checked))
        _settle()
    try:
        yield
    finally:
        with _state.lock:
            _state.blocks[:] = [block for block in _state.blocks if block[0] is not token]
            _settle()


def is_patched() -> bool:
    """Whether DataLoaders made through torch.utils.data.DataLoader are guarded now."""
    return _state.in_force is not None
