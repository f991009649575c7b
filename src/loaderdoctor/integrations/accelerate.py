"""The ceiling's data-free turns (tap/ceiling.py) for a Trainer's train loader that accelerate dispatches: its
DataLoaderDispatcher (an IterableDataset's loader, or dispatch_batches=True) iterates the DataLoader on the main
process alone, and every process gets its slice of each step's batch through a broadcast. There the turns go
through the dispatcher's own epochs, on every process: while the training runs, the dispatcher class's __iter__ is
hooked for that one dispatcher (any other passes through), and its epochs go through a TrainerCeiling. A data-free
step hands each process its own last slice again without asking the dispatcher, so that no process enters its
broadcast then (as a plain loop feeding a cached batch would not), and every process does so at the same steps,
since each counts the same deliveries. The hook is put back at the training's end (unless something replaced it
since: then it passes everything through)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

from loaderdoctor.integrations.trainer.ceiling import TrainerCeiling


def dispatched_batches(loader: Any) -> int | None:
    """How many batches of the DataLoader that accelerate's DataLoaderDispatcher `loader` wraps make one of its
    batches (one per process; one with split_batches); None when `loader` is no dispatcher."""
    try:
        from accelerate.data_loader import DataLoaderDispatcher
    except ImportError:  # pragma: no cover - the Trainer needs accelerate
        return None
    if not issubclass(type(loader), DataLoaderDispatcher):
        return None
    if loader.split_batches or getattr(loader, "submesh_tp", None) is not None:
        return 1
    return max(1, int(loader.state.num_processes))


class DispatcherTurns:
    """The hook on the class of the dispatcher `wrapper` (where its __iter__ is defined) that puts `wrapper`'s
    epochs through `ceiling`'s turns, installed until restore(), or until `wrapper` is gone (a train() that raised,
    whose callback was never told of its end)."""

    def __init__(self, wrapper: Any, ceiling: TrainerCeiling) -> None:
        owner = next(cls for cls in type(wrapper).__mro__ if "__iter__" in cls.__dict__)
        original: Callable[[Any], Iterator[Any]] = owner.__dict__["__iter__"]
        turns = self

        def __iter__(loader: Any) -> Iterator[Any]:
            batches = original(loader)
            return ceiling.iterator(batches) if loader is turns.wrapper() else batches

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        self.wrapper: Callable[[], Any] = weakref.ref(wrapper)
        self.owner, self.original, self.hook = owner, original, __iter__
        owner.__iter__ = __iter__  # type: ignore[method-assign]
        weakref.finalize(wrapper, self.restore)

    def restore(self) -> None:
        """The dispatcher's class as it was (a hook replaced since stays, and passes everything through)."""
        self.wrapper = lambda: None
        if self.owner.__dict__.get("__iter__") is self.hook:
            self.owner.__iter__ = self.original  # type: ignore[method-assign]
