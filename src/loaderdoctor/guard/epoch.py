"""One epoch of a guarded loader as the training loop iterates it, with torch's `_workers` (the live worker
processes, which torch's own exit tests read) of the iterator it reads from now."""

from __future__ import annotations

from typing import Any


class EpochWorkers:
    """The `_workers` list of the torch iterator an epoch reads from now; None without one (no workers)."""

    processes: list[Any] | None = None


class EpochIterator:
    """One epoch of a GuardedLoader."""

    def __init__(self, guarded: Any, epoch: int, workers: EpochWorkers) -> None:
        self._guarded = guarded
        self.epoch = epoch
        self._epoch_workers = workers

    @property
    def _workers(self) -> list[Any]:
        """torch's iterator's list of worker processes (multiprocessing Process objects), read by torch's exit
        tests: the workers this epoch reads from now (after a restart, the new ones; after the epoch, its last
        ones). Like torch's, absent (AttributeError) while loading runs in the main process."""
        processes = self._epoch_workers.processes
        if processes is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '_workers': no worker processes")
        return processes

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Any:
        return self._guarded._next(self.epoch)

    def __len__(self) -> int:
        return len(self._guarded)
