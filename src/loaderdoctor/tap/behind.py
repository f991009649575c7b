"""torch's iterator behind a loader's own: a loader whose __iter__ is a generator around torch's (litdata's
StreamingDataLoader) hands the tap no iterator with workers, and makes torch's only at its first next(). The
iterators such a loader makes are noted for one epoch through an attribute of the loader itself (no class is
patched), held weakly, and the attribute is taken away again."""

from __future__ import annotations

import weakref
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from loaderdoctor.workers.processes import worker_pids

_MARK = "_loaderdoctor_notes"  # on the attribute this module sets: one of ours, which a later epoch may replace


def has_workers(iterator: Any) -> bool:
    """Whether an iterator is one of torch's own (or has worker processes as torch's has)."""
    return isinstance(iterator, _BaseDataLoaderIter) or bool(worker_pids(iterator))


class IteratorsMade:
    """torch's iterators a loader makes (DataLoader._get_iterator, which torch's __iter__ calls) while this notes
    them: from its making until remove(), for a loader of workers whose own __iter__ is not torch's."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        self._made: list[weakref.ref[Any]] = []
        self._installed = False
        if not isinstance(loader, DataLoader) or type(loader).__iter__ is DataLoader.__iter__ or not loader.num_workers:
            return
        there = vars(loader).get("_get_iterator")
        if there is not None and not getattr(there, _MARK, False):
            return  # someone else's: left as it is, and the workers are not found
        vars(loader).pop("_get_iterator", None)  # an earlier epoch's, left by an epoch given up before its batch
        make = loader._get_iterator

        def noted() -> Any:
            made = make()
            self._made.append(weakref.ref(made))
            return made

        setattr(noted, _MARK, True)
        try:
            loader._get_iterator = noted  # type: ignore[method-assign]
            self._installed = True
        except Exception:  # a loader that refuses new attributes: its workers are not found
            pass

    def latest(self) -> Any:
        """torch's iterator made last (or the loader's persistent one), alive; None without one."""
        for ref in reversed(self._made):
            if (made := ref()) is not None:
                return made
        return getattr(self._loader, "_iterator", None)

    def remove(self) -> None:
        """The loader as it was."""
        if self._installed:
            self._installed = False
            vars(self._loader).pop("_get_iterator", None)
