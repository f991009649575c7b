"""The dataset indices a loader's sampler gives torch's iterator of that loader, noted as the iterator asks for
them: what a rank of a watched run drew, to compare with the other ranks' draws without drawing from the user's
sampler apart (which would move its random stream, and so the training's)."""

from __future__ import annotations

from typing import Any

import numpy as np


class DrawnIndices:
    """Stands in for the `_sampler_iter` of torch's iterator `iterator` (what torch's `_BaseDataLoaderIter` draws
    each batch's indices from: its batch sampler's lists, or its sampler's indices one by one) and notes the
    indices it hands on, `limit` at most. At the limit, or at an index that is no integer, torch's own is put
    back and nothing more is noted.

    torch's multiprocess iterator draws its first num_workers x prefetch_factor batches' indices while it is made,
    before this can stand in: those go unnoted, the same first batches on every rank. The ranks' draws are
    compared as sets of indices, which that leaves as they were."""

    def __init__(self, iterator: Any, limit: int) -> None:
        self._iterator = iterator
        self._source = iterator._sampler_iter
        self._left = limit
        self._noted: list[int] = []  # since the last take()
        iterator._sampler_iter = self

    @classmethod
    def of(cls, iterator: Any, limit: int) -> DrawnIndices | None:
        """The noting of `iterator`'s draws; None when it has no `_sampler_iter` of its own (not torch's iterator:
        it draws no indices that could be noted here)."""
        if limit <= 0 or "_sampler_iter" not in getattr(iterator, "__dict__", {}):
            return None
        if iterator._sampler_iter is None:
            return None
        if callable(getattr(iterator._sampler_iter, "state_dict", None)):
            return StatefulDrawnIndices(iterator, limit)
        return cls(iterator, limit)

    def __iter__(self) -> DrawnIndices:
        return self

    def __next__(self) -> Any:
        item = next(self._source)  # StopIteration ends the epoch, as torch's would
        if self._left > 0:
            self._note(item)
        return item

    def _note(self, item: Any) -> None:
        for index in item if isinstance(item, (list, tuple)) else (item,):
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
                self._stop()  # a dataset keyed otherwise: its draws cannot be compared as indices
                return
            self._noted.append(int(index))
            self._left -= 1
            if self._left <= 0:
                self._stop()
                return

    def _stop(self) -> None:
        """torch's own `_sampler_iter` back in place (unless torch made a new one since): no more noting."""
        self._left = 0
        if self._iterator.__dict__.get("_sampler_iter") is self:
            self._iterator._sampler_iter = self._source

    def take(self) -> list[int] | None:
        """The indices noted since the last take(); None when there are none."""
        if not self._noted:
            return None
        noted, self._noted = self._noted, []
        return noted


class StatefulDrawnIndices(DrawnIndices):
    """DrawnIndices for a sampler iterator that keeps its own state (torchdata's StatefulDataLoader saves and
    restores it through `state_dict`/`load_state_dict`, where the iterator's position is): both passed to it, so
    that a state taken while this stands in resumes as it would have."""

    def state_dict(self) -> Any:
        return self._source.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self._source.load_state_dict(state)
