"""RunRecorder: the tap's events from a user's own training loop, kept as a Recording of the real run.

A batch's step is the time the loop spent outside next() after it: from its delivery to the next next() (or to
the next() that ended the epoch). A long run keeps every epoch's start-up batches and an even thinning of the
rest, so that its memory stays bounded however many batches go by; counts and rates cover every batch. Epochs
and batches are written as the probe writes them (recording/epochbook.py): only the loop is the user's."""

from __future__ import annotations

import signal
import statistics
import time
import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor.host.facts import OtherLoad, host_facts
from loaderdoctor.loader.facts import MAX_DRAWN, LoaderFacts
from loaderdoctor.loader.indexed import parse_sample_failures
from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.epochbook import EpochBook, OpenEpoch
from loaderdoctor.recording.record import BatchRecord, Recording, SampleError, WorkerDeath, startup_batches
from loaderdoctor.tap.deathwatch import WorkerEnd, ended_with_job
from loaderdoctor.tap.events import (
    BatchDelivered,
    BatchFailed,
    DataFreeBatch,
    EpochEnded,
    Event,
    IteratorCreated,
    WorkersStarted,
)
from loaderdoctor.workers.deaths import oom_kills, signal_name
from loaderdoctor.workers.poller import WorkerPoller

# BatchRecords kept at most: past this, every other kept one goes (start-up batches always stay).
MAX_BATCH_RECORDS = 50_000
# Workers' memory and CPU are read this often: reading a worker's USS (/proc/PID/smaps) takes its memory map's
# lock, which costs a busy worker time when done often (measured with scale: 5-8% at 0.25 s, ~1% at 2 s).
SAMPLE_EVERY_S = 2.0
KEEP_SAMPLE_ROUNDS = 4000


def sampler_epoch(loader: DataLoader) -> int | None:
    """The epoch of the loader's shuffling sampler that has set_epoch() (DistributedSampler and its kind),
    None without one."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for sampler in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
        if sampler is not None and hasattr(sampler, "set_epoch") and getattr(sampler, "shuffle", False):
            epoch = getattr(sampler, "epoch", None)
            if isinstance(epoch, int):
                return epoch
    return None


class RunRecorder:
    """Listens to a tap (or to events made alike from a trainer's hooks) and keeps the Recording of the run.
    `sampler_epoch` reads the loader's shuffling sampler's epoch at each iter(); `is_death(error)` tells a
    worker's death from a sample that raised, and `death` describes one (which worker, how it ended)."""

    def __init__(
        self,
        facts: LoaderFacts,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sampler_epoch: Callable[[], int | None] = lambda: None,
        is_death: Callable[[BaseException], bool] = lambda error: False,
        death: Callable[[int, int, BaseException], WorkerDeath] = lambda epoch, index, error: WorkerDeath(
            epoch, index, str(error)
        ),
        max_batches: int = MAX_BATCH_RECORDS,
        oom_kills_before: int | None = None,
    ) -> None:
        self.clock = clock
        self.started = clock()
        self._sampler_epoch = sampler_epoch
        # The run's worker poller, once worker_poller() made it: held weakly, as its owner holds it and its `pids`
        # often hold this recorder (a cycle would keep a dropped loader's persistent workers for the collector).
        self._poller: weakref.ref[WorkerPoller] | None = None
        self._is_death = is_death
        self._death = death
        self._max_batches = max_batches
        self._oom_kills_before = oom_kills_before
        self._ends: list[WorkerEnd] = []  # workers' ends told by the death watch, not yet written as deaths
        self._ended_at: dict[int, float] = {}  # pid -> when a death was recorded (a stop's is none: see finish)
        self.rec = Recording(
            settings=settings,
            start_method=settings.effective_start_method,
            batch_size=facts.batch_size,
            batches_per_epoch=facts.batches_per_epoch,
            iterable=facts.iterable,
            step_s=None,
            budget_s=0.0,
            host=host_facts(),
            dataset=facts.dataset,
            dataset_len=facts.dataset_len,
            loader_class=facts.loader_class,
            drop_last=facts.drop_last,
            sampler_drop_last=facts.sampler_drop_last,
            sampler=facts.sampler,
            sampler_distributed=facts.distributed,
            samples_per_epoch=facts.samples_per_epoch,
        )
        self._first_epoch: int | None = None  # the epoch of the run's first batch: its draws are kept
        self.other_load = OtherLoad()
        self.book = EpochBook(self.rec, clock, self.started)
        self.worker_pids: list[int] = []
        self.delivered = 0  # every batch delivered in the run
        self.wait_s = 0.0  # the run's total wait in next(), every batch counted
        self.step_s = 0.0  # the run's total time in steps whose end was seen
        self.samples = 0  # samples delivered in the run
        self._stride = 1  # one batch in `_stride` past the start-up is kept
        self._open_step: BatchRecord | None = None  # the batch whose step goes on now
        self._open_step_from = 0.0  # when that step began (its batch's delivery)
        self.finished = False

    @property
    def tally(self) -> OpenEpoch | None:
        """The open epoch's running totals."""
        return self.book.open

    @property
    def last_tally(self) -> OpenEpoch | None:
        """The last epoch's, open or closed."""
        return self.book.last

    # The tap's events

    def on_event(self, event: Event) -> None:
        if self._ends:
            self._write_ends()  # before the event: a guard's restart after a death comes after it
        if isinstance(event, BatchDelivered):
            self._delivered(event)
        elif isinstance(event, IteratorCreated):
            self._iterator_created(event)
        elif isinstance(event, WorkersStarted):
            self.worker_pids = list(event.worker_pids)
            self.book.workers_started(event)
        elif isinstance(event, EpochEnded):
            self._epoch_ended(event)
        elif isinstance(event, BatchFailed):
            self._failed(event)
        elif isinstance(event, DataFreeBatch):
            self._close_step(self.clock())  # a data-free step (tap/ceiling.py) is no batch of the run's

    def _iterator_created(self, event: IteratorCreated) -> None:
        now = self.clock()
        self.worker_pids = list(event.worker_pids)
        tally = self.book.open
        if tally is not None and tally.epoch == event.epoch:
            self.book.restarted(event)  # a guard's new iterator within the epoch: the loop goes on past a death
            if self.rec.outcome == "crashed":
                self.rec.outcome = "completed"
            self._close_step(now - event.create_s)
            return
        self._end_epoch(now - event.create_s, "left")  # the loop left the last epoch before its end
        self.book.created(event).sampler_epoch = self._sampler_epoch()

    def _delivered(self, event: BatchDelivered) -> None:
        now = self.clock()
        self._close_step(now - event.wait_s, event.step_run_delay_s)
        batch = self.book.delivered(event, now)
        poller = self._poller() if self._poller is not None else None
        if poller is not None and self.book.startup_just_ended():
            poller.poll_soon()  # the workers' memory as they start: the base of their growth
        self._drawn(event)
        self.delivered += 1
        self.samples += event.samples
        self.wait_s += event.wait_s
        self._open_step, self._open_step_from = batch, now
        startup = self.book.open.startup if self.book.open is not None else 1
        if batch.index < startup or self.delivered % self._stride == 0:
            self.rec.batches.append(batch)
            if len(self.rec.batches) > self._max_batches:
                self._thin()

    def _drawn(self, event: BatchDelivered) -> None:
        """The first epoch's draws kept, MAX_DRAWN at most of each: the indices its sampler gave (the tap notes
        them in the first epoch only) and its samples' fingerprints."""
        if self._first_epoch is None:
            self._first_epoch = event.epoch
        rec = self.rec
        if event.indices:
            kept = rec.drawn_indices if rec.drawn_indices is not None else []
            kept.extend(event.indices[: MAX_DRAWN - len(kept)])
            rec.drawn_indices = kept
        if event.fingerprints and event.epoch == self._first_epoch:
            rec.drawn_fingerprints.extend(event.fingerprints[: MAX_DRAWN - len(rec.drawn_fingerprints)])

    def _failed(self, event: BatchFailed) -> None:
        now = self.clock()
        self._close_step(now - event.wait_s)
        batch = self.book.failed(event)  # its place in the epoch, across a guard's new iterators
        epoch = self.book.open.epoch if self.book.open is not None else event.epoch
        if self._is_death(event.error):
            self.worker_died(event.epoch, batch, event.error)
            return
        for index, error_type, message in parse_sample_failures(event.error):
            self.rec.sample_errors.append(SampleError(epoch, batch, index, error_type, message))

    def worker_died(self, epoch: int, index: int, error: BaseException) -> None:
        """A worker's death, raised by next() at batch `index` or by torch's SIGCHLD handler wherever the main
        thread was (a listener, say): the loop ends, unless a guard starts an iterator again (_iterator_created).
        The one the death watch told already (its pid) is not written twice; a stop's is not a death."""
        epoch = self.tally.epoch if self.tally is not None else epoch
        if self._ends:
            self._write_ends()
        death = self._death(epoch, index, error)
        if ended_with_job(death.exitcode):
            return
        if death.pid is not None and any(known.pid == death.pid for known in self.rec.worker_deaths):
            self.rec.outcome = "crashed"
            return
        self._add_death(death, time.monotonic())

    def note_end(self, end: WorkerEnd) -> None:
        """A worker's end told by the death watch (in the main thread from its handler, or from its thread): only
        kept here; written as a death at the next event or at finish()."""
        self._ends.append(end)

    def _write_ends(self) -> None:
        ends, self._ends = self._ends, []
        for end in ends:
            if any(known.pid == end.pid for known in self.rec.worker_deaths):
                continue
            tally = self.tally
            epoch = tally.epoch if tally is not None else 0
            batch = tally.batches + tally.failed if tally is not None else 0
            oom_now = oom_kills() if end.exitcode == -signal.SIGKILL else None
            before = self._oom_kills_before
            death = WorkerDeath(epoch, batch, _end_words(end), pid=end.pid, exitcode=end.exitcode, index=end.index,
                                oom_kill=None if oom_now is None or before is None else oom_now > before)  # fmt: skip
            self._add_death(death, end.at)

    def _add_death(self, death: WorkerDeath, at: float) -> None:
        self.rec.worker_deaths.append(death)
        if death.pid is not None:
            self._ended_at[death.pid] = at
        self.rec.outcome = "crashed"

    def _stops_left_out(self) -> None:
        """The deaths that a stop signal of the whole job caused (it reached this process as well) are no deaths:
        left out once the run is over, when every stop that came is known."""
        kept = [
            death for death in self.rec.worker_deaths
            if not ended_with_job(death.exitcode, self._ended_at.get(death.pid or -1))
        ]  # fmt: skip
        if len(kept) < len(self.rec.worker_deaths):
            self.rec.worker_deaths = kept
            if not kept and self.rec.outcome == "crashed":
                self.rec.outcome = "completed"

    def _epoch_ended(self, event: EpochEnded) -> None:
        now = self.clock()
        self._close_step(now - event.wait_s)
        self._end_epoch(now, "exhausted", end_s=event.wait_s)

    # Steps and epochs

    def close_step(self) -> None:
        """The open step ended now: a trainer's end-of-batch hook says so (a tapped loop's step ends at the next
        next() instead)."""
        self._close_step(self.clock())

    def _close_step(self, loop_back_at: float, run_delay_s: float | None = None) -> None:
        """The open step ended when the loop called next() again at `loop_back_at`, the loop's thread descheduled
        for `run_delay_s` of it (when the tap counted it)."""
        batch = self._open_step
        if batch is None:
            return
        self._open_step = None
        batch.step_s = max(0.0, loop_back_at - self._open_step_from)
        if run_delay_s is not None:
            batch.step_run_delay_s = min(batch.step_s, run_delay_s)
        self.step_s += batch.step_s
        if self.book.open is not None:
            self.book.open.step_s += batch.step_s

    def _end_epoch(self, now: float, ended: str, end_s: float = 0.0) -> None:
        if self.book.open is None:
            return
        if self._open_step is not None:  # the loop left with a step under way: its end is unknown
            self._open_step.step_s = self._typical_step_s()
            self._open_step = None
        self.book.close(ended, at=now, end_s=end_s)

    def _typical_step_s(self) -> float:
        steps = [b.step_s for b in self.rec.batches[-200:] if b is not self._open_step]
        return statistics.median(steps) if steps else 0.0

    def _thin(self) -> None:
        """Keep every other batch past the start-ups, and from now on one in twice as many."""
        self._stride *= 2
        startup = startup_batches(self.rec)
        open_startup = self.book.open.startup if self.book.open is not None else 1
        kept = []
        for n, batch in enumerate(self.rec.batches):
            if batch.index < startup.get(batch.epoch, open_startup) or n % 2 == 0:
                kept.append(batch)
        self.rec.batches = kept

    def worker_poller(self, pids: Callable[[], list[int]]) -> WorkerPoller:
        """The poller of the workers' memory and CPU for this run (its rounds thinned over a long run), woken as
        started workers end their start-up."""
        poller = WorkerPoller(
            pids, interval_s=SAMPLE_EVERY_S, clock=self.clock, t0=self.started, keep_rounds=KEEP_SAMPLE_ROUNDS
        )
        self._poller = weakref.ref(poller)
        return poller

    # The end

    def so_far(self, settings: Settings | None = None, poller: Any = None) -> Recording:
        """A copy of the Recording of the run up to its last epoch's end, as finish() gives it, the run going on
        (taken at an epoch's end, or later: an open epoch is left out, as its batches are, and so is what came
        after the last epoch's end, Ray Train's shutdown after a worker's training, say)."""
        rec = Recording.from_dict(self.rec.to_dict())
        open_epoch = self.book.open.epoch if self.book.open is not None else None
        if open_epoch is not None:
            rec.batches = [b for b in rec.batches if b.epoch != open_epoch]
        ended = [epoch for epoch in rec.epochs if epoch.epoch != open_epoch]
        now = self.clock()
        if ended:
            now = min(now, self.started + max(epoch.started_s + epoch.wall_s for epoch in ended))
        self._complete(rec, now, settings, poller)
        rec.host_samples = [reading for reading in rec.host_samples if reading.t_s <= rec.wall_s]
        rec.worker_samples = [reading for reading in rec.worker_samples if reading.t_s <= rec.wall_s]
        return rec

    def finish(self, settings: Settings | None = None, poller: Any = None) -> Recording:
        """The Recording of the run so far, complete; `poller` is the worker poller whose rounds it keeps.
        Safe to call more than once (the first call's Recording stands)."""
        rec = self.rec
        if self.finished:
            return rec
        self.finished = True
        if self._ends:
            self._write_ends()
        self._stops_left_out()
        now = self.clock()
        self._end_epoch(now, "time")
        self.other_load.observe()
        self._complete(rec, now, settings, poller)
        return rec

    def _complete(self, rec: Recording, now: float, settings: Settings | None, poller: Any) -> None:
        """What a Recording of the run up to `now` holds beside its epochs and batches."""
        if settings is not None:
            rec.settings = settings
            rec.start_method = settings.effective_start_method
        rec.wall_s = now - self.started
        steps = [b.step_s for b in rec.batches]
        rec.step_s = statistics.median(steps) if steps else None
        if len(rec.batches) != self.delivered:
            rec.batches_delivered = self.delivered
        if poller is not None:
            rec.worker_samples = list(poller.readings)
            rec.host_samples = list(poller.host_readings)
        rec.other_processes = self.other_load.busiest(rec.wall_s)


def _end_words(end: WorkerEnd) -> str:
    how = f"killed by {signal_name(end.exitcode)}" if end.exitcode < 0 else f"exited with status {end.exitcode}"
    return f"DataLoader worker (pid {end.pid}) {how}"
