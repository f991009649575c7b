"""HookedLoader: one loader of a trainer measured from the hooks around its batches alone, as the tap's events
for a RunRecorder, so that a trainer's run gets the Recording, the rules and the history of watch().

The wait for a batch runs from the end hook of the batch before (or from its epoch's start) to this batch's
start hook, less the time set aside meanwhile (a validation run inside a training epoch is neither the training
step nor a wait for training data); the step runs from the start hook to the end hook. A trainer that fetches
several batches before one step hook (Hugging Face's Trainer, accumulating gradients) has them recorded as batches
taking turns (batches_stepped)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor.history.records import now_iso
from loaderdoctor.host.forkhazards import iterator_facts
from loaderdoctor.host.snapshot import take_snapshot
from loaderdoctor.integrations.trainer.loadingerrors import is_death_of
from loaderdoctor.loader.facts import loader_facts
from loaderdoctor.loader.settings import LoaderSpec
from loaderdoctor.recording.record import IteratorFacts
from loaderdoctor.report import LoaderReport
from loaderdoctor.rules import diagnose
from loaderdoctor.rules.finding import Finding
from loaderdoctor.tap.events import (
    BatchDelivered,
    BatchFailed,
    EpochEnded,
    IteratorCreated,
    batch_nbytes,
    batch_samples,
)
from loaderdoctor.watch.progress import Progress
from loaderdoctor.watch.recorder import RunRecorder, sampler_epoch
from loaderdoctor.watch.watchrun import finish_run
from loaderdoctor.workers.poller import thread_run_delay_s

Moment = tuple[float, float]  # (clock, the process's CPU seconds) at a hook


@dataclasses.dataclass(frozen=True)
class Stretch:
    """A loader's figures since the last stretch: what a trainer's logger is given every few steps."""

    batches: int
    batches_per_s: float | None
    wait_fraction: float | None  # of the time in waits and steps


class HookedLoader:
    """One loader (or a trainer's combination of loaders, measured as one) observed through a trainer's hooks.
    `workers()` names its worker pids at each epoch's first batch (see WorkerCensus); `batches_per_epoch` is
    what the trainer takes of it per epoch; `kind` is the history's kind of its run."""

    def __init__(
        self,
        name: str,
        loaders: Sequence[DataLoader],
        *,
        batches_per_epoch: int | None,
        workers: Callable[[], list[int]],
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time,
        kind: str = "lightning",
        run_delay: Callable[[], float | None] = thread_run_delay_s,
    ) -> None:
        self.name = name
        self._run_delay = run_delay  # the hooks' thread's run delay (None where not counted): with the clocks
        self.kind = kind
        self.loader = loaders[0]
        self.settings = LoaderSpec.from_loader(self.loader).settings
        facts = dataclasses.replace(loader_facts(self.loader), batches_per_epoch=batches_per_epoch)
        loader = self.loader
        self._batch_size = facts.batch_size or 1
        self._clock = clock
        self._replay: tuple[int, float] | None = None  # (thread, clock) while batches_stepped() replays a step
        self.recorder = RunRecorder(
            facts,
            self.settings,
            clock=self._recorder_clock,
            sampler_epoch=lambda: sampler_epoch(loader),
            is_death=self._is_death,
        )
        self.worker_pids: list[int] = []
        self.poller = self.recorder.worker_poller(lambda: self.worker_pids)
        self.started_at = now_iso()
        self.snapshot = take_snapshot()
        self.epoch = -1
        self._workers = workers
        self._cpu_clock = cpu_clock
        self._epoch_from: Moment | None = None  # the epoch's start, until its first batch opens it in the recorder
        self._facts: IteratorFacts | None = None
        self._epoch_open = False
        self._in_step = False
        self._idle_from: Moment = self.moment()  # the last end hook, or the epoch's start
        # The hooks' thread's run delay at that moment: the part of a wait other processes held the cores (the
        # machine's load, not the data's), read as the tap reads it; None where the kernel does not count it.
        self._delay_from: float | None = self._run_delay()
        self._aside: Moment = (0.0, 0.0)  # set aside since then
        self._paused_at: Moment | None = None
        self._aside_total_s = 0.0
        self._mark = (self.recorder.started, 0, 0.0, 0.0, 0.0)  # clock, batches, wait, step, set aside
        self.finished = False
        self.poller.start()

    def moment(self) -> Moment:
        """Now, as the hooks mark it."""
        return self._clock(), self._cpu_clock()

    @property
    def idle_since(self) -> Moment:
        """When the loop last left this loader's step (its last end hook), or began its epoch."""
        return self._idle_from

    @property
    def in_step(self) -> bool:
        return self._in_step

    # The hooks

    def epoch_started(self, at: Moment | None = None, facts: IteratorFacts | None = None) -> None:
        """A new epoch begins (at `at`, default now), just before the trainer's iter() of the loader; `facts`
        are the main process's as that iter() started workers (taken now when not given and workers start)."""
        self.epoch_ended()
        self.epoch += 1
        self._epoch_from = self._idle_from = at or self.moment()
        self._delay_from = self._run_delay() if at is None else None  # an earlier moment's delay is not known
        self._aside, self._paused_at = (0.0, 0.0), None
        self._in_step = False
        settings = self.settings
        fresh = settings.num_workers == 0 or not settings.persistent_workers or self.epoch == 0
        if not fresh:
            self._facts = None
        elif facts is None:
            self._facts = iterator_facts(self.epoch, settings.effective_start_method)
        else:
            self._facts = dataclasses.replace(facts, epoch=self.epoch, start_method=settings.effective_start_method)

    def batch_started(self, batch: Any) -> None:
        """The trainer's hook before the step on `batch`: its wait ends."""
        # The clock last, as the recorder stamps the batch delivered: time taken off the core at the other reads is
        # then in the wait and in its run delay, and never between the wait and the step.
        cpu = self._cpu_clock()
        delay = self._run_delay() if self._delay_from is not None else None
        now = self._clock()
        first_batch_s = None
        if self._epoch_from is not None:
            first_batch_s = now - self._epoch_from[0]
            self._open_epoch(now)
        wait_s, wait_cpu_s = self._waited(now, cpu)
        set_aside = self._aside != (0.0, 0.0) or self._paused_at is not None  # its delay is not the wait's alone
        wait_run_delay_s = None
        if delay is not None and self._delay_from is not None and not set_aside:
            wait_run_delay_s = min(wait_s, max(0.0, delay - self._delay_from))
        self.recorder.on_event(
            BatchDelivered(
                epoch=self.epoch,
                index=self._batch_index(),
                wait_s=wait_s,
                wait_cpu_s=wait_cpu_s,
                nbytes=batch_nbytes(batch),
                samples=batch_samples(batch, self._batch_size),
                first_batch_s=first_batch_s,
                wait_run_delay_s=wait_run_delay_s,
            )
        )
        self._in_step = True

    def batch_ended(self) -> None:
        """The trainer's hook after the step: the step ends, the wait for the next batch begins."""
        if not self._in_step:
            return
        # The CPU clock and the run delay are read before the step ends and the wait begins: each read is a system
        # call, where a loop that other processes crowd is taken off its core. Read after the wait's clock, and the
        # run delay last, that time (2 to 4 ms of a 40 ms step beside CPU hogs, with nothing to load) was a wait
        # for data and not in the wait's run delay. It is the loop's own time: the step's.
        cpu = self._cpu_clock()
        delay = self._run_delay()
        self.recorder.close_step()
        self._in_step = False
        self._idle_from = (self._clock(), cpu)
        self._delay_from = delay
        self._aside, self._paused_at = (0.0, 0.0), None

    def batches_stepped(self, count: int, started: Moment, data_free: int = 0) -> None:
        """`count` batches were fetched in one go before the step hook at `started`, then stepped on one after the
        other until now (the end hook): recorded as `count` batches taking turns, each with an even share of the
        wait since the last end hook (less the time set aside) and of the steps. Their samples are the loader's
        batch size each (no batch is seen). `data_free` more batches of the step were handed again (the ceiling's
        turns): the wait is the real ones', their share of the steps is set aside."""
        if count < 1:
            if data_free:
                self.data_free_step(started)
            return
        now = self.moment()
        wait_s, wait_cpu_s = self._waited(*started)
        share_wait, share_cpu = wait_s / count, wait_cpu_s / count
        share_step = max(0.0, now[0] - started[0]) / (count + data_free)
        self._aside_total_s += data_free * share_step
        now = (now[0] - data_free * share_step, now[1])  # the real batches' steps end there
        # The first batch arrives one share of the wait before the hook, as if the others had been fetched after
        # it; each next batch one step and one share of the wait later; the last step ends now.
        first_at = started[0] - (count - 1) * share_wait
        thread = threading.get_ident()
        try:
            for n in range(count):
                at = first_at + n * (share_wait + share_step)
                self._replay = (thread, at)
                first_batch_s = None
                if self._epoch_from is not None:
                    first_batch_s = at - self._epoch_from[0]
                    self._open_epoch(at)
                event = BatchDelivered(
                    epoch=self.epoch,
                    index=self._batch_index(),
                    wait_s=share_wait,
                    wait_cpu_s=share_cpu,
                    nbytes=0,
                    samples=self._batch_size,
                    first_batch_s=first_batch_s,
                )
                self.recorder.on_event(event)
                self._replay = (thread, at + share_step)
                self.recorder.close_step()
        finally:
            self._replay = None
        self._in_step = False
        self._idle_from = self.moment() if data_free else now
        self._aside, self._paused_at = (0.0, 0.0), None

    def data_free_step(self, started: Moment) -> None:
        """The step from `started` (its start hook) to now was on a batch handed again (the ceiling's turns,
        tap/ceiling.py): no batch of the run's, and its time is set aside, as a tapped loop's data-free step is
        (RunRecorder's DataFreeBatch). The time before it stays the next batch's wait (a trainer that fetches a batch
        ahead fetched a real one there)."""
        now, cpu = self.moment()
        seconds, cpu_s = max(0.0, now - started[0]), max(0.0, cpu - started[1])
        self._idle_from = (self._idle_from[0] + seconds, self._idle_from[1] + cpu_s)
        if self._epoch_from is not None:
            self._epoch_from = (self._epoch_from[0] + seconds, self._epoch_from[1] + cpu_s)
        self._aside_total_s += seconds
        self._delay_from = None  # the thread's run delay over the wait alone is not known
        self._in_step = False

    def epoch_ended(self) -> None:
        """The epoch's last batch went by (a later call for the same epoch does nothing)."""
        if self._epoch_open:
            self._epoch_open = False
            self._in_step = False
            tally = self.recorder.tally
            batches = tally.batches if tally is not None else 0
            started = tally.started if tally is not None else self._clock()
            self.recorder.on_event(EpochEnded(self.epoch, batches, self._clock() - started))
        self._epoch_from = None

    def pause(self, at: Moment | None = None) -> None:
        """From `at` (default now) the time is not this loader's: another loader runs (validation)."""
        if self._paused_at is None:
            self._paused_at = at or self.moment()

    def resume(self) -> None:
        """The time is this loader's again."""
        if self._paused_at is None:
            return
        now, cpu = self.moment()
        seconds, cpu_s = max(0.0, now - self._paused_at[0]), max(0.0, cpu - self._paused_at[1])
        self._aside = (self._aside[0] + seconds, self._aside[1] + cpu_s)
        self._aside_total_s += seconds
        self._paused_at = None

    def failed(self, error: BaseException) -> None:
        """`error` ended the wait for the next batch (a sample that raised, a worker that died)."""
        if self._in_step or (self._epoch_from is None and not self._epoch_open):
            return
        now, cpu = self.moment()
        if self._epoch_from is not None:
            self._open_epoch(now)
        wait_s, _ = self._waited(now, cpu)
        self.recorder.on_event(BatchFailed(self.epoch, self._batch_index(), wait_s, error))

    # Figures as it goes

    def start_stretch(self, at: float | None = None) -> None:
        """The next stretch begins at `at` (default now)."""
        r = self.recorder
        self._mark = (self._clock() if at is None else at, r.delivered, r.wait_s, r.step_s, self._aside_total_s)

    def stretch(self) -> Stretch:
        """Batches, rate and wait share since the last stretch (time set aside left out); a new one begins."""
        recorder = self.recorder
        now = self._clock()
        since, batches, wait_s, step_s, aside_s = self._mark
        delivered = recorder.delivered - batches
        seconds = now - since - (self._aside_total_s - aside_s)
        wait, step = recorder.wait_s - wait_s, recorder.step_s - step_s
        self.start_stretch(now)
        return Stretch(
            batches=delivered,
            batches_per_s=delivered / seconds if delivered and seconds > 0 else None,
            wait_fraction=wait / (wait + step) if delivered and wait + step > 0 else None,
        )

    def epoch_progress(self, epochs: int | None, cost_per_hour: float | None) -> Progress | None:
        """The last epoch ended, in the figures of watch()'s epoch line; None before one ended."""
        epochs_seen = self.recorder.rec.epochs
        tally = self.recorder.last_tally
        if not epochs_seen or tally is None:
            return None
        record = epochs_seen[-1]
        seconds = max(record.wall_s, 1e-9)
        busy = tally.wait_s + tally.step_s
        return Progress(
            name=self.name,
            epoch=record.epoch,
            epochs=epochs,
            batch=record.batches,
            batches_per_epoch=self.recorder.rec.batches_per_epoch,
            batches_per_s=record.batches / seconds if record.batches else None,
            samples_per_s=tally.samples / seconds if record.batches else None,
            wait_share=tally.wait_s / busy if busy > 0 else None,
            cost_per_hour=cost_per_hour,
        )

    # The end

    def finish(self, *, history: bool, main: bool, job: Finding | None = None) -> LoaderReport | None:
        """Stop measuring and diagnose the run: with `main` (rank 0) as watch() does, logged and kept in the
        history (with `history`), the job's finding `job` among its findings; on other ranks only diagnosed. None
        when no epoch began."""
        if self.finished:
            return None
        self.finished = True
        self.poller.stop()
        if self._epoch_from is not None and self.recorder.tally is None:
            self._epoch_from = None  # workers still starting: an epoch with no batch yet is not recorded
        if not self.recorder.rec.epochs and self.recorder.tally is None:
            return None
        rec = self.recorder.finish(self.settings, self.poller)
        if not main:
            return LoaderReport(self.name, rec, diagnose(rec))
        return finish_run(
            self.kind, self.name, rec, self.started_at, self.snapshot, history=history, log_it=False, job=job
        )

    # Inside

    def _open_epoch(self, now: float) -> None:
        """The epoch's first batch (or its failure) came: the recorder's epoch opens at the epoch's start, with the
        workers started meanwhile."""
        assert self._epoch_from is not None
        self.worker_pids = self._workers()
        create_s = now - self._epoch_from[0]
        self.recorder.on_event(IteratorCreated(self.epoch, self._facts, list(self.worker_pids), create_s))
        self._epoch_from = None
        self._epoch_open = True

    def _recorder_clock(self) -> float:
        """The recorder's clock: the trainer's, but for the thread that replays a step (batches_stepped), which
        gives it the moment of each batch it replays."""
        replay = self._replay
        if replay is not None and replay[0] == threading.get_ident():
            return replay[1]
        return self._clock()

    def _waited(self, now: float, cpu: float) -> Moment:
        aside_s, aside_cpu_s = self._aside
        if self._paused_at is not None:  # a failure while paused: the pause so far is set aside too
            aside_s += now - self._paused_at[0]
            aside_cpu_s += cpu - self._paused_at[1]
        return (
            max(0.0, now - self._idle_from[0] - aside_s),
            max(0.0, cpu - self._idle_from[1] - aside_cpu_s),
        )

    def _batch_index(self) -> int:
        tally = self.recorder.tally
        return tally.batches if tally is not None else 0

    def _is_death(self, error: BaseException) -> bool:
        return is_death_of(error, self.worker_pids)
