"""Which dataset index each worker is loading at this moment, kept where the main process can read it after the
worker died: so that the sample that killed a worker (a segfault, SIGKILL, the OOM killer) is named by its index,
in check's report and by the guard (which skips it under on_sample_error="skip").

A small file in the run's private temporary folder holds one 8-byte slot per worker; each worker maps it into
memory when it starts (attach(), from the worker hook, which also clears a slot a worker of an earlier epoch
may have left), then writes the index before it loads a sample and clears it after: two stores per sample.
Only the path is pickled, so the same object reaches forked, forkserver and spawned workers alike.
"""

from __future__ import annotations

import mmap
import operator
import os
import struct
import tempfile
from typing import Any

_SLOT = struct.Struct("<q")
_NONE = -(2**63)  # no sample in hand: between samples, or an index that is not an integer


class InHand:
    """The slots of one internal loader's workers: written in the workers, read in the main process."""

    def __init__(self, folder: str, num_workers: int) -> None:
        descriptor, self.path = tempfile.mkstemp(prefix="in-hand-", suffix=".bin", dir=folder)
        try:
            os.write(descriptor, _SLOT.pack(_NONE) * max(1, num_workers))
        finally:
            os.close(descriptor)
        self._map: mmap.mmap | None = None  # mapped in a worker only (attach)
        self._offset = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._map, self._offset = None, 0

    def attach(self, worker_id: int) -> None:
        """In worker `worker_id`, as it starts: map its slot, holding nothing."""
        with open(self.path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), 0)
        self._offset = worker_id * _SLOT.size
        _SLOT.pack_into(self._map, self._offset, _NONE)

    def loading(self, index: Any) -> None:
        """In a worker: `index` is being loaded now (a worker that dies before done() died on it)."""
        if self._map is None:
            return  # the main process: nothing to tell
        try:
            value = operator.index(index)
        except TypeError:
            value = _NONE
        if not _NONE < value < 2**63:
            value = _NONE  # no 8-byte integer: nothing to name it by
        _SLOT.pack_into(self._map, self._offset, value)

    def done(self) -> None:
        """In a worker: the sample came back (or raised): nothing in hand."""
        if self._map is not None:
            _SLOT.pack_into(self._map, self._offset, _NONE)

    def read(self, worker_id: int) -> int | None:
        """In the main process: the index worker `worker_id` was loading, None when it held none."""
        try:
            with open(self.path, "rb") as file:
                file.seek(worker_id * _SLOT.size)
                data = file.read(_SLOT.size)
        except OSError:
            return None
        if len(data) < _SLOT.size:
            return None
        (value,) = _SLOT.unpack(data)
        return None if value == _NONE else value


class NotingWorkerInit:
    """A loader's worker_init_fn while its iterator starts workers (see tap/iterator.py): in each worker it maps
    `in_hand` and notes there the index of every sample the worker's fetcher loads (torch's map-style fetcher, in
    that worker process only), then runs the user's own `worker_init_fn`. The user's dataset, sampler and batches
    are untouched. A dataset that loads a batch at once (`__getitems__`) leaves the index unknown."""

    def __init__(self, in_hand: InHand, worker_init_fn: Any) -> None:
        self.in_hand = in_hand
        self.worker_init_fn = worker_init_fn

    def __call__(self, worker_id: int) -> None:
        try:
            self.in_hand.attach(worker_id)
            _note_fetches(self.in_hand)
        except Exception:  # a worker that cannot note its index loads as it would without
            pass
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)


def _note_fetches(in_hand: InHand) -> None:
    """In a worker: torch's map-style fetcher notes each index in `in_hand` while it loads it."""
    from torch.utils.data._utils import fetch

    fetcher = fetch._MapDatasetFetcher
    original = fetcher.fetch
    if getattr(original, "_notes_in_hand", False):
        return

    def noted(self: Any, possibly_batched_index: Any) -> Any:
        dataset = self.dataset
        if self.auto_collation and getattr(dataset, "__getitems__", None):
            return original(self, possibly_batched_index)
        try:
            if not self.auto_collation:
                in_hand.loading(possibly_batched_index)
                return self.collate_fn(dataset[possibly_batched_index])
            data = []
            for index in possibly_batched_index:
                in_hand.loading(index)
                data.append(dataset[index])
        finally:
            in_hand.done()
        return self.collate_fn(data)

    noted._notes_in_hand = True  # type: ignore[attr-defined]
    fetcher.fetch = noted  # type: ignore[method-assign]
