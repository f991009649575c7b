"""The tap: wraps a DataLoader's iterator, passes batches through untouched, and emits plain events."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader, IterableDataset

from loaderdoctor.host.forkhazards import iterator_facts
from loaderdoctor.loader.facts import length_or_none
from loaderdoctor.tap.behind import IteratorsMade, has_workers
from loaderdoctor.tap.ceiling import CeilingTurns
from loaderdoctor.tap.drawn import DrawnIndices
from loaderdoctor.tap.events import (
    BatchDelivered,
    BatchFailed,
    DataFreeBatch,
    EpochEnded,
    Event,
    IteratorCreated,
    Listener,
    WorkersStarted,
    batch_nbytes,
    batch_samples,
)
from loaderdoctor.tap.fingerprints import TALLIED_PER_EPOCH, sample_fingerprints
from loaderdoctor.tap.signals import raise_if_stopping
from loaderdoctor.workers.currentindex import InHand, NotingWorkerInit
from loaderdoctor.workers.poller import run_delay_s, thread_run_delay_s
from loaderdoctor.workers.processes import exited_workers, worker_pids

RECENT_BATCHES = 100  # the watchdog's yardstick is the slowest of the last 50 to 100 batches


class RecentWaits:
    """The slowest of the recent steady-state waits (the last RECENT_BATCHES / 2 to RECENT_BATCHES): the
    watchdog's yardstick follows the batches down after a hiccup as well as up, so one slow batch does not set
    the deadline for the rest of the run. Two blocks of half the window each: a few operations per batch."""

    def __init__(self, size: int = RECENT_BATCHES) -> None:
        self._block = max(1, size // 2)
        self._count = 0  # waits in the current block
        self._current = 0.0  # the slowest of the current block
        self._previous = 0.0  # the slowest of the block before

    def add(self, wait_s: float) -> None:
        if wait_s > self._current:
            self._current = wait_s
        self._count += 1
        if self._count == self._block:
            self._previous, self._current, self._count = self._current, 0.0, 0

    @property
    def slowest_s(self) -> float:
        return max(self._previous, self._current)


def starts_workers(loader: DataLoader) -> bool:
    """Whether the loader's next iter() starts worker processes: persistent ones start only once."""
    persistent_alive = loader.persistent_workers and getattr(loader, "_iterator", None) is not None
    return loader.num_workers > 0 and not persistent_alive


# Where torch re-raises, in the main process, an exception the dataset (or collate_fn) raised in a worker.
_RERAISE = ExceptionWrapper.reraise.__code__


def raised_in_worker(error: BaseException) -> bool:
    """Whether `error` is the dataset's (or collate_fn's) own, raised in a worker and re-raised by torch: told by
    where it was raised (torch's ExceptionWrapper.reraise), not by its words."""
    traceback = error.__traceback__
    if traceback is None:
        return False
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback.tb_frame.f_code is _RERAISE


# A worker's death also shows as other errors (a batch whose shared memory cannot be fetched from it any more:
# ConnectionResetError, EOFError...), maybe an instant before its process has ended: give it this long to be seen.
DEATH_GRACE_S = 0.5
# Tries at saying a failed next() when errors keep cutting it short (a second worker's death, say).
MAX_FAILURE_TRIES = 3


def is_worker_death(error: BaseException, iterator: Any, grace_s: float = DEATH_GRACE_S) -> bool:
    """Whether `error` comes of a worker of `iterator` that died: torch's RuntimeError (from next(), or from its
    SIGCHLD handler wherever the main thread is) or what the death broke (a reset connection, an EOFError), while
    one has ended or ends within `grace_s`; never an error the dataset raised in a worker (told without waiting)."""
    return not raised_in_worker(error) and bool(exited_workers(iterator, grace_s))


def shutdown(loader: DataLoader, iterator: Any) -> None:
    """End a loader's workers now, persistent ones included, instead of whenever garbage collection runs."""
    if hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    if getattr(loader, "_iterator", None) is iterator:
        loader._iterator = None


class TapIterator:
    """One epoch of a tapped loader. Exceptions from the loader pass through after a BatchFailed event,
    and iteration may go on after them, as it can with a DataLoader."""

    def __init__(self, tap: Tap, epoch: int) -> None:
        self._tap = tap
        self.epoch = epoch
        self.index = 0  # the number of the next batch, failed ones counted
        self.delivered = 0
        self.data_free = 0  # data-free batches handed this epoch (the ceiling's turns)
        # the epoch's length, for the ceiling's turns: its last batch ends a measured span (tap/ceiling.py)
        self.batches_in_epoch = tap.batches_per_epoch() if tap.ceiling is not None else None
        self.fingerprinted = 0  # samples of this epoch fingerprinted (see BatchDelivered.fingerprints)
        self.interrupted = False  # the last next() was ended by Ctrl-C or SystemExit
        self.failed_wait_s = 0.0  # how long the last next() that raised had waited
        self.delay_at_delivery: float | None = None  # the loop's thread's run delay when it last got a batch
        self.pids: list[int] = []
        loader = tap.loader
        # Persistent workers start once; later iter() calls fork nothing, so there is no state to record.
        # Without workers the facts still tell whether adding workers under fork would be safe.
        fresh = loader.num_workers == 0 or starts_workers(loader)
        self.started_workers = loader.num_workers > 0 and fresh
        facts = iterator_facts(epoch, tap.start_method) if fresh else None
        self.started_at = tap.clock()
        self.waiting_since: float | None = self.started_at  # iter() itself may block on worker start-up
        tap.current = self  # complete now, and before iter(): a watchdog sees a hang inside it too
        if self.started_workers:
            raise_if_stopping()  # a job being stopped (its signal held back, or caught) starts no worker
        self._made = IteratorsMade(loader)
        self.inner = tap.open_torch_iterator()
        if has_workers(self.inner):
            self._made.remove()
        self.drawn = DrawnIndices.of(self.inner, tap.draws_to_note)  # the indices its sampler gives it
        tap.draws_to_note = 0  # the first epoch's only
        self.waiting_since = None
        self.pids = worker_pids(self.torch_inner)  # persistent ones behind a generator: the loader's own iterator
        tap.emit(IteratorCreated(epoch, facts, self.pids, tap.clock() - self.started_at))

    def __iter__(self) -> TapIterator:
        return self

    @property
    def torch_inner(self) -> Any:
        """torch's iterator of this epoch: the loader's own where it is torch's (or has workers as torch's has),
        else the one it made behind it (see tap/behind.py), else the loader's own."""
        if has_workers(self.inner):
            return self.inner
        behind = self._made.latest()
        return behind if behind is not None else self.inner

    def _workers_behind(self) -> None:
        """The workers of torch's iterator behind the loader's own, found after its first next(), told."""
        self.pids = worker_pids(self.torch_inner)
        if self.pids:
            self._made.remove()
            self._tap.emit(WorkersStarted(self.epoch, list(self.pids)))

    def _end_epoch(self, asked: float) -> NoReturn:
        """The epoch is over, the loop having asked for a batch more at `asked`: said, and StopIteration raised."""
        tap = self._tap
        self._made.remove()
        self.waiting_since = None
        ended = tap.clock()
        if tap.ceiling is not None:
            tap.ceiling.left_epoch(asked)
        tap.emit(EpochEnded(self.epoch, self.index, ended - self.started_at, ended - asked))
        raise StopIteration

    def _failed(self, started: float, error: Exception) -> Exception:
        """The failed next() said in a BatchFailed event, and the error to raise: `error`, or one that cut the
        saying short. Torch's SIGCHLD handler raises a worker's death wherever the main thread is, and often just
        here, right after the reset connection or EOFError the death caused: the death is then what is said, and
        raised. Once the event is out, an error raised in a listener is that listener's to record (watch's records
        a death there), and is only raised."""
        said = False
        for _ in range(MAX_FAILURE_TRIES):
            try:
                if not said:
                    self.waiting_since = None
                    self.failed_wait_s = self._tap.clock() - started
                    index = self.index
                    said = True
                    self.index = index + 1
                    self._tap.emit(BatchFailed(self.epoch, index, self.failed_wait_s, error))
                return error
            except Exception as late:
                error = late
        return error

    def __next__(self) -> Any:
        tap = self._tap
        clock = tap.clock
        if tap.ceiling is not None:
            if tap.ceiling.epoch_over(self.delivered, self.data_free, self.batches_in_epoch):
                self._end_epoch(clock())  # it kept its length: its last real batches are left unasked
            if (again := tap.ceiling.hand_again(self.epoch, clock())) is not None:
                self.data_free += 1
                self.delay_at_delivery = None  # the next real batch's step is not this one's
                tap.emit(DataFreeBatch(self.epoch))
                return again
        # Events are made only for listeners: a guard without any pays for a clock read or two per batch.
        listening = bool(tap.listeners)
        # The CPU clock and the run delay before the wait's clock: each read is a system call, where a loop that
        # other processes crowd is taken off its core, and that time is the loop's, not a wait for data.
        cpu_started = time.process_time() if listening else 0.0
        delay_started = thread_run_delay_s() if listening else None
        self.waiting_since = started = clock()
        if self.interrupted and not self.delivered:
            self.started_at = started
        self.interrupted = False
        step_run_delay_s = None
        if delay_started is not None and self.delay_at_delivery is not None:
            step_run_delay_s = max(0.0, delay_started - self.delay_at_delivery)
        self.delay_at_delivery = None
        try:
            batch = next(self.inner)
        except StopIteration:
            self._end_epoch(started)
        except Exception as error:
            failure = self._failed(started, error)
            if failure is error:
                raise
            raise failure  # noqa: B904 (it arose while `error` was handled, and already has it as its context)
        except BaseException:
            # Ctrl-C (or SystemExit) ended the wait: nobody waits now, and a first batch's clock starts anew at
            # the next next(), so that the pause before it is no start-up and no stall.
            self.waiting_since = None
            self.interrupted = True
            raise
        delivered = clock()
        self.waiting_since = None
        wait_s = delivered - started
        first_batch_s = None
        if self.delivered:
            tap.waits.add(wait_s)
        else:
            first_batch_s = delivered - self.started_at
            if self.started_workers and not self.pids:
                self._workers_behind()
        self.delivered += 1
        if tap.ceiling is not None:
            epoch_ends = self.delivered == self.batches_in_epoch
            tap.ceiling.delivered(self.epoch, batch, wait_s, delivered, data_free=False, epoch_ends=epoch_ends)
        if listening:
            wait_cpu_s = time.process_time() - cpu_started
            delay_now = thread_run_delay_s() if delay_started is not None else None
            wait_run_delay_s = None if delay_now is None else min(wait_s, max(0.0, delay_now - delay_started))
            self.delay_at_delivery = delay_now
            startup_run_delay_s = None
            if first_batch_s is not None and self.started_workers and self.pids:
                worker_delay = run_delay_s(self.pids[0])
                if worker_delay is not None:
                    startup_run_delay_s = min(first_batch_s, max(worker_delay, wait_run_delay_s or 0.0))
            samples = batch_samples(batch, tap.loader.batch_size or 1)
            fingerprints = None
            if tap.fingerprints and self.fingerprinted < TALLIED_PER_EPOCH:
                fingerprints = sample_fingerprints(batch, samples)
                self.fingerprinted += len(fingerprints or ())
            indices = self.drawn.take() if self.drawn is not None else None
            tap.emit(
                BatchDelivered(
                    epoch=self.epoch,
                    index=self.index,
                    wait_s=wait_s,
                    wait_cpu_s=wait_cpu_s,
                    nbytes=batch_nbytes(batch),
                    samples=samples,
                    first_batch_s=first_batch_s,
                    fingerprints=fingerprints,
                    indices=indices,
                    wait_run_delay_s=wait_run_delay_s,
                    startup_run_delay_s=startup_run_delay_s,
                    step_run_delay_s=step_run_delay_s,
                )
            )
        self.index += 1
        return batch

    def close(self) -> None:
        """End this iterator's workers now."""
        self._made.remove()
        shutdown(self._tap.loader, self.torch_inner)


class Tap:
    """Instruments a DataLoader: each epoch() is a TapIterator that reports to the listeners. `open_iterator`
    makes torch's iterator of the loader (iter(), unless iter() itself is hooked, as `loaderdoctor run` hooks it).
    The samples of an IterableDataset are fingerprinted as they are delivered (to listeners only): its workers may
    each repeat the whole stream; a map-style dataset's are not (its sampler deals each index out once)."""

    def __init__(
        self,
        loader: DataLoader,
        listeners: list[Listener],
        *,
        start_method: str | None,
        clock: Callable[[], float] = time.perf_counter,
        open_iterator: Callable[[DataLoader], Any] = iter,
    ) -> None:
        self.loader = loader
        self.open_iterator = open_iterator
        self.listeners = listeners
        self.start_method = start_method
        self.clock = clock
        self.fingerprints = isinstance(getattr(loader, "dataset", None), IterableDataset)  # decided once
        self._current: weakref.ref[TapIterator] | None = None
        self.waits = RecentWaits()  # the watchdog's yardstick; a guard hands the same one to each new tap
        self.ceiling: CeilingTurns | None = None  # data-free turns, when the run measures its ceiling
        # The index each worker is loading (map-style datasets), read when one dies; with `note_in_workers`, the
        # workers this tap's iter() starts note it there themselves (a guard's dataset notes its own instead).
        self.in_hand: InHand | None = None
        self.note_in_workers = False
        # Of a map-style dataset, how many of the indices its sampler gives the next iter()'s torch iterator are
        # noted (tap/drawn.py) and told in BatchDelivered.indices: set by a watch for its first epoch; 0, none.
        self.draws_to_note = 0

    def open_torch_iterator(self) -> Any:
        """torch's iterator of the loader; the workers it starts (with `note_in_workers`) note the index they load
        (their worker_init_fn is NotingWorkerInit for the time of iter(), then the user's again)."""
        loader = self.loader
        if not self.note_in_workers or self.in_hand is None or not starts_workers(loader):
            return self.open_iterator(loader)
        users = loader.worker_init_fn
        try:
            loader.worker_init_fn = NotingWorkerInit(self.in_hand, users)
        except Exception:  # a loader that keeps its worker_init_fn its own way: no index named
            return self.open_iterator(loader)
        try:
            return self.open_iterator(loader)
        finally:
            loader.worker_init_fn = users

    def held(self, worker_id: int) -> int | None:
        """The dataset index worker `worker_id` is loading (or was, when it died); None when unknown."""
        return self.in_hand.read(worker_id) if self.in_hand is not None else None

    @property
    def current(self) -> TapIterator | None:
        """The epoch being iterated, while its iterator lives. Held weakly: a TapIterator holds its tap, and a
        cycle would leave torch's iterator to the garbage collector, which ends persistent workers only after
        torch's 5 s join timeout each (a plain loop ends them as soon as the loader is dropped)."""
        return self._current() if self._current is not None else None

    @current.setter
    def current(self, iterator: TapIterator | None) -> None:
        self._current = weakref.ref(iterator) if iterator is not None else None

    def batches_per_epoch(self) -> int | None:
        """The loader's batches in an epoch as its sampler has them now; None where unknown (an IterableDataset,
        whose length is at most an estimate, or a sampler without one)."""
        if self.fingerprints:  # an IterableDataset
            return None
        return length_or_none(self.loader)

    @property
    def slowest_wait_s(self) -> float:
        """The slowest of the recent steady-state batches."""
        return self.waits.slowest_s

    def emit(self, event: Event) -> None:
        for listener in self.listeners:
            listener(event)

    def epoch(self, epoch: int) -> TapIterator:
        return TapIterator(self, epoch)

    def torch_iterator(self) -> Any:
        """torch's iterator of the current epoch; the loader's own while iter() is still making it (a persistent
        iterator's reset may fail half-way)."""
        current = self.current
        inner = current.torch_inner if current is not None and hasattr(current, "inner") else None
        return inner if inner is not None else getattr(self.loader, "_iterator", None)
