"""WorkerCensus: which of this process's DataLoader worker processes belong to which loader of a trainer.

A trainer iterates its loaders itself: loaderdoctor never holds torch's iterator, whose `_workers` name them (the
loader keeps it as `loader._iterator` only for persistent workers). psutil's children() of this process would
not do either: with forkserver the workers are the fork server's children, not this process's, and other
children (a launcher's ranks, the resource tracker) are no workers. multiprocessing.active_children() lists
every process that this process started and that still runs, whatever the start method, and torch starts its
workers as daemon processes from there. A trainer starts one loader's workers at a time, in the iter() just
before that loader's first batch: so a loader's workers are the daemon processes that appeared since the census
last looked, read at its first batch, plus the persistent workers its own iterator names."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence

from torch.utils.data import DataLoader

from loaderdoctor.workers.processes import worker_pids


class WorkerCensus:
    """The owner of each worker process alive, by the key of the loader (e.g. "train", "val") that started it."""

    def __init__(self) -> None:
        self._owner: dict[int, str] = {}

    def claim(self, key: str, loaders: Sequence[DataLoader]) -> list[int]:
        """The pids of the workers of `key`'s loaders now, at their first batch: the daemon processes started
        since the census last looked become `key`'s, with the persistent workers its loaders' iterators name."""
        if not any(loader.num_workers > 0 for loader in loaders):
            return []
        alive = {p.pid for p in multiprocessing.active_children() if p.daemon and p.pid is not None}
        self._owner = {pid: owner for pid, owner in self._owner.items() if pid in alive}
        for loader in loaders:
            for pid in worker_pids(getattr(loader, "_iterator", None)):
                self._owner[pid] = key
        for pid in alive:
            self._owner.setdefault(pid, key)
        return sorted(pid for pid, owner in self._owner.items() if owner == key)
