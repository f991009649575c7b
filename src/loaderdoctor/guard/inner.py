"""One internal DataLoader the guard built, with its tap, watchdog and workers, held where it can be released."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loaderdoctor.guard import children
from loaderdoctor.guard.batchplan import PlannedBatchSampler
from loaderdoctor.guard.samples import SkipReports
from loaderdoctor.guard.streams import GuardedStream
from loaderdoctor.host.tempfolders import make_private_folder, remove_folder
from loaderdoctor.loader.settings import Settings
from loaderdoctor.tap.iterator import Tap, TapIterator, shutdown
from loaderdoctor.tap.watchdog import Watchdog
from loaderdoctor.workers.currentindex import InHand
from loaderdoctor.workers.deaths import CRASH_SIGNALS
from loaderdoctor.workers.processes import exited_workers, worker_pids

if TYPE_CHECKING:
    from torch.utils.data import DataLoader


@dataclass(frozen=True)
class HeldAtDeath:
    tasks: list[int]  # the iterator's task numbers (batches counted from its start) the dead workers held
    index: int | None  # the dataset index one was loading, when known
    crashed: bool  # that worker ended by a signal its own code raised: the sample is the cause


class Inner:
    """One internal DataLoader at one Settings: its planned sampler (or, over an IterableDataset, its dataset
    wrapper), its tap, and its current iterator."""

    def __init__(
        self,
        loader: DataLoader,
        sampler: PlannedBatchSampler | None,
        settings: Settings,
        tap: Tap,
        reports: SkipReports | None = None,
        stream: GuardedStream | None = None,
        in_hand: InHand | None = None,
    ) -> None:
        self.loader = loader
        self.sampler = sampler  # None over an IterableDataset
        self.stream = stream  # the IterableDataset's wrapper, which the next iterator's workers receive
        self.rotation = 0  # over an IterableDataset: the stream id of worker 0 of the workers alive
        self.settings = settings
        self.tap = tap
        self.reports = reports  # the replaced samples' reports, under on_sample_error="skip"
        self.in_hand = in_hand  # the index each worker is loading now (map-style datasets, with workers)
        self.iteration = 0  # the guard's number for the current iterator, which tags its requests
        self.iterator: TapIterator | None = None
        self.watchdog: Watchdog | None = None
        self.start = 0  # the plan position of the current iterator's first batch
        self.pids: list[int] = []
        # Set by the SIGCHLD handler (children.py) and by interrupt(): see children.Watched.
        self.died: str | None = None
        self.interrupt_requested = False
        self.passed_a_batch = False  # Ctrl-C ended a main-process next(): its iterator is past the batch it loaded

    @property
    def stalled(self) -> bool:
        """Whether the watchdog fired and ended the workers (without workers it can only report)."""
        return self.watchdog is not None and self.watchdog.fired is not None and self.settings.num_workers > 0

    def torch_iterator(self) -> Any:
        """torch's iterator now: the current epoch's, or the loader's own (a persistent one between epochs)."""
        return self.iterator.inner if self.iterator is not None else getattr(self.loader, "_iterator", None)

    def dead_workers(self, grace_s: float) -> list[int]:
        """The pids of this loader's workers that have exited, waiting up to grace_s for one to."""
        return exited_workers(self.torch_iterator(), grace_s)

    def held_at_death(self, dead: list[int]) -> HeldAtDeath:
        """What the workers among `dead` (pids) had in hand: their tasks whose batch the main process had not
        received (torch's _task_info; one of them killed it, torch does not say which it had finished), and the
        dataset index one was loading (in_hand), with how that worker ended."""
        torch_iterator = self.torch_iterator()
        workers = list(getattr(torch_iterator, "_workers", []))
        ids = {worker_id for worker_id, worker in enumerate(workers) if worker.pid in dead}
        tasks = getattr(torch_iterator, "_task_info", None) or {}
        held = sorted(task for task, info in tasks.items() if len(info) == 1 and info[0] in ids)
        if self.in_hand is not None:
            for worker_id in sorted(ids):
                index = self.in_hand.read(worker_id)
                if index is not None:
                    return HeldAtDeath(held, index, -(workers[worker_id].exitcode or 0) in CRASH_SIGNALS)
        return HeldAtDeath(held, None, False)

    def stop_watching(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()

    def end_iterator(self) -> None:
        """End the current iterator's workers unless they persist into the next epoch."""
        if self.iterator is not None and not self.loader.persistent_workers:
            self.iterator.close()
            children.forget(self.pids)
            self.pids = []
        self.iterator = None

    def close(self) -> None:
        """Stop watching and end every worker of this loader now."""
        self.stop_watching()
        # iter() may have failed half-way (a persistent iterator's reset waits on its workers): then the
        # loader holds the torch iterator, and the TapIterator was never made.
        torch_iterator = self.iterator.inner if self.iterator is not None else getattr(self.loader, "_iterator", None)
        if torch_iterator is not None:
            pids = worker_pids(torch_iterator)
            shutdown(self.loader, torch_iterator)
            children.forget(pids)
        children.forget(self.pids)
        self.pids = []
        self.iterator = None


class Resources:
    """What a GuardedLoader must release (workers, watchdog thread, stack files), held apart from it so that
    releasing it when the loader is garbage-collected needs no reference to the loader."""

    def __init__(self) -> None:
        self.inner: Inner | None = None
        self.dump_dir: str | None = None
        # A forked worker holds a copy of this, which its garbage collector may release: workers and folders
        # are the process's that made them, which alone may end them.
        self.pid = os.getpid()

    def stack_dir(self) -> str:
        if self.dump_dir is None:
            self.dump_dir = make_private_folder("loaderdoctor-guard-")
        return self.dump_dir

    def release(self) -> None:
        if os.getpid() != self.pid:
            return
        if self.inner is not None:
            self.inner.close()
            self.inner = None
        if self.dump_dir is not None:
            remove_folder(self.dump_dir)
            self.dump_dir = None
