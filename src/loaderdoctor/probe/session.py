"""A probe session: one loader with one Settings run through the tap, window by window (each window warmed up
first), kept as a Recording; verify and scale take turns between sessions, probe.py runs one for a fixed time."""

from __future__ import annotations

import contextlib
import logging
import statistics
import threading
from typing import Any

from loaderdoctor.errors import StopMeasuring
from loaderdoctor.host.facts import OtherLoad, host_facts
from loaderdoctor.host.tempfolders import make_private_folder, remove_folder
from loaderdoctor.loader.datasetcopy import own_copy
from loaderdoctor.loader.facts import class_words, length_or_none
from loaderdoctor.loader.indexed import IndexedDataset
from loaderdoctor.loader.pickling import pickled_bytes
from loaderdoctor.loader.settings import Settings, quiet_worker_count_advice
from loaderdoctor.probe.budget import deadline_allowance
from loaderdoctor.probe.epochs import EpochLoop, close_iterator
from loaderdoctor.probe.measuring import Measuring, ProbeProgress
from loaderdoctor.recording.epochbook import EpochBook
from loaderdoctor.recording.forksafety import forkserver_blocker, recorded_hazards
from loaderdoctor.recording.rates import epoch_overhead_s, first_startup_s
from loaderdoctor.recording.record import Recording, Stall, Window, WorkerStack
from loaderdoctor.tap.events import BatchDelivered, BatchFailed, Event, IteratorCreated, WorkersStarted
from loaderdoctor.tap.interrupt import MainThreadInterrupter
from loaderdoctor.tap.iterator import Tap, TapIterator
from loaderdoctor.tap.stalls import Ended, respond_to_stall
from loaderdoctor.tap.watchdog import StallNotice, Watchdog
from loaderdoctor.workers.currentindex import InHand
from loaderdoctor.workers.deaths import oom_kills
from loaderdoctor.workers.hook import THREADS_PER_WORKER, ProbeWorkerHook
from loaderdoctor.workers.poller import WorkerPoller, thread_idle
from loaderdoctor.workers.sites import read_worker_activity

log = logging.getLogger("loaderdoctor")


# A window's warm-up lasts at least this long, so that the workers of a session paused just before go idle.
SETTLE_S = 0.2
# A session resumes with the batches its workers prefetched during the pause: a loop whose step is nearly as long
# as a batch's loading drains that backlog slowly (4 batches at 1/step - 1/interval = 8 batches/s: 0.5 s). The
# warm-up goes on until a batch waits in next() for this share of the step (the loop has caught up with the
# workers), or BACKLOG_ROUNDS times the batches in flight went by (a loader that keeps up never waits).
CAUGHT_UP_SHARE = 0.1
BACKLOG_ROUNDS = 4


class ProbeSession(EpochLoop):
    """One loader with one Settings, measured through the tap: start() runs the first iter() up to the first
    batch (the start-up, measured apart), run() measures steady windows of running, epochs rolling over as in
    a training loop, and close() ends every worker and returns the Recording. Between windows the loader
    waits (workers idle with their batches prefetched), so that two sessions can take turns, each window of
    one beside a window of the other. The loader, its training step, stall policy, clock and progress come
    as one Measuring. With `lock_free`, the workers' file-lock calls on files opened read-only
    are no-ops (see filelocks.py): the loader measured as it would run without those locks."""

    def __init__(self, measuring: Measuring, settings: Settings, *, lock_free: bool = False) -> None:
        spec, clock = measuring.spec, measuring.clock
        self.spec = spec
        self.settings = settings
        self.step = measuring.step
        self.policy = measuring.policy
        self.progress = measuring.progress
        self.clock = clock
        self.consumer = threading.current_thread()
        self.interrupter = MainThreadInterrupter()
        start_method = settings.effective_start_method
        self.rec = Recording(
            settings=settings,
            start_method=start_method,
            batch_size=spec.batch_size,
            batches_per_epoch=length_or_none(spec.build(settings.replace(num_workers=0))),
            iterable=spec.is_iterable,
            step_s=None,
            budget_s=0.0,
            host=host_facts(),
            dataset=type(spec.dataset).__name__,
            dataset_len=length_or_none(spec.dataset),
            loader_class=class_words(spec.own.cls),
        )
        if start_method in ("spawn", "forkserver"):
            self.rec.pickled_dataset_bytes = pickled_bytes(spec, start_method)
        self.dump_dir = make_private_folder("loaderdoctor-stacks-")
        try:
            workers = settings.num_workers if settings.backend == "process" else 0
            self.in_hand = InHand(self.dump_dir, workers) if workers and not spec.is_iterable else None
            # Loading in this process gets a copy: what it sets on the dataset (a file opened on first use) would
            # reach the workers forked later, here, which a training loop's workers never inherit.
            dataset = spec.dataset if workers else own_copy(spec.dataset)
            loader = spec.build(
                settings,
                dataset=dataset if spec.is_iterable else IndexedDataset(dataset, self.in_hand),
                worker_hook=ProbeWorkerHook(self.dump_dir, lock_free=lock_free, in_hand=self.in_hand)
                if settings.num_workers
                else None,
            )
        except BaseException:
            remove_folder(self.dump_dir)
            raise
        self.oom_kills_before = oom_kills()
        self.started = clock()
        self.book = EpochBook(self.rec, clock, self.started)  # the tap's events, as a watched run keeps them
        self.tap = Tap(loader, [self.on_event], start_method=start_method, clock=clock)
        self.poller = WorkerPoller(self.current_pids, clock=clock, t0=self.started, own_threads=THREADS_PER_WORKER)
        self.watchdog = Watchdog(self.tap, self.policy, self.on_stall, workers_idle=self.poller.cpu_idle)
        self.other_load = OtherLoad()
        self.iterator: TapIterator | None = None  # the open epoch's
        self.last_iterator: TapIterator | None = None  # the last epoch's, whose workers may persist
        self.epoch = -1  # the epoch under way (its iterator open), or the last one
        self.step_times: list[float] = []
        self.last_step_end = 0.0
        self.held_batch: Any = None
        self._counted = 0  # batches that count towards the current stretch's minimum
        self.startup_count = 1  # the open epoch's start-up batches
        self.budget_s = 0.0  # for the progress display: what this session was given so far
        self.closed = False
        self.poller.start()
        self.watchdog.start()

    @property
    def ran(self) -> bool:
        """Whether the loader is still measurable: nothing stalled, crashed or ended the run."""
        return self.rec.outcome == "completed" and not self.closed

    # What the tap and the watchdog report

    def current_pids(self) -> list[int]:
        current = self.tap.current
        return list(current.pids) if current is not None else []

    def on_event(self, event: Event) -> None:
        if isinstance(event, IteratorCreated):
            self.book.created(event)
        elif isinstance(event, WorkersStarted):
            self.book.workers_started(event)
        elif isinstance(event, BatchDelivered):
            self.rec.batches.append(self.book.delivered(event, self.clock()))
            if self.book.startup_just_ended() or event.first_batch_s is not None:
                # The workers' memory as they start (the base of their growth) and as each epoch begins, however
                # short the epochs: a trend to judge growth by, where rounds spaced by their cost would leave a
                # run of short epochs one reading after start-up.
                self.poller.poll_soon()
        elif isinstance(event, BatchFailed):
            self.book.failed(event)  # what the failure was, the loop records where next() raised it (epochs.py)

    def on_stall(self, notice: StallNotice) -> None:
        """From the watchdog's thread: capture where loading is stuck, then end the stuck next() (see stalls.py).
        Workers killed: torch notices at once through its SIGCHLD handler in the main thread, else within its
        5 s check."""

        def record(stacks: list[WorkerStack]) -> None:
            # Set before the workers are killed: the loop reads it when their death ends the stuck next().
            if notice.pids:
                idle = self.poller.cpu_idle(notice.pids, self.policy.idle_window_s)
            else:
                idle = thread_idle(self.consumer)
            self.rec.stall = Stall(
                epoch=notice.epoch,
                batch=notice.batch,
                waited_s=notice.waited_s,
                threshold_s=notice.threshold_s,
                reason=notice.reason,
                stacks=stacks,
                workers_cpu_idle=idle,
                over_budget=notice.over_budget,
            )
            log.warning("stall at epoch %d batch %d: %s", notice.epoch, notice.batch, notice.reason)

        ended = respond_to_stall(
            notice, dump_dir=self.dump_dir, consumer=self.consumer, interrupter=self.interrupter, record=record
        )
        if ended is Ended.WAITING:
            if self.consumer is threading.main_thread():
                log.error("%s", self.interrupter.why_not())
            else:
                log.error("loading is stuck in a thread that cannot be interrupted: see the stack above")

    # Running

    def start(self, *, startup_limit_s: float) -> bool:
        """Run the first iter() until its first batch, and that batch's step: the start-up every run pays
        once. Whether a batch came (else the outcome says why)."""
        self.budget_s += startup_limit_s
        self.watchdog.deadline = self.clock() + startup_limit_s
        with self.interrupter, quiet_worker_count_advice(), self.deaths_recorded():
            if not self._open_epoch():
                return False
            with contextlib.suppress(StopMeasuring):  # the step may end the measuring at once
                self._roll(until=0.0, min_batches=1, epochs=None, share_epochs=False, steady=False)
        return self.ran and bool(self.rec.batches)

    def run(
        self,
        seconds: float,
        *,
        epochs: int | None = None,
        share_epochs: bool = False,
        warm_up: bool = False,
        min_batches: int = 0,
    ) -> Window | None:
        """Measure steady running for about `seconds`: batches through the step, epochs rolling over; at most
        `epochs` epochs in all when given, each epoch then ending when its share of the time is spent if
        `share_epochs` (so that a long epoch does not hide the start-up of the next). With `warm_up`, the
        batches prefetched during a pause (and the moment another session's workers need to go idle) come
        first and outside the window. The window goes on past `seconds` until it holds `min_batches` steady
        batches (an epoch's start-up may fall into it), within reason. The window measured, or None when
        nothing could run."""
        if not self.ran:
            return None
        self.budget_s += seconds
        begun = self.clock()
        self.watchdog.deadline = begun + deadline_allowance(seconds * 1.5)
        if self.iterator is not None:
            self.last_step_end = begun  # a pause between windows is no part of an epoch's end
        self.poller.resume()
        measured_from = begun
        try:
            with self.interrupter, quiet_worker_count_advice(), self.deaths_recorded():
                if warm_up:
                    self._roll(
                        until=begun + SETTLE_S,
                        min_batches=self.settings.batches_in_flight + 1,
                        give_up=begun + seconds / 2,
                        epochs=epochs,
                        share_epochs=False,
                        steady=False,
                    )
                    self._drain_backlog(give_up=begun + seconds / 2, epochs=epochs)
                measured_from = self.clock()
                self.poller.poll_once(private_memory=False)  # the window's CPU figures start exactly here
                with contextlib.suppress(StopMeasuring):  # the step ended the window (ranks stop together)
                    self._roll(
                        until=measured_from + seconds,
                        min_batches=min_batches,
                        give_up=measured_from + seconds + 2 * self._epoch_start_s() + 1.0,
                        epochs=epochs,
                        share_epochs=share_epochs,
                        steady=True,
                    )
        finally:
            self.poller.pause()
            self.other_load.observe()
        window = Window(measured_from - self.started, self.clock() - self.started)
        self.rec.windows.append(window)
        return window

    def _drain_backlog(self, *, give_up: float, epochs: int | None) -> None:
        """Deliver batches, outside the window, until one waits CAUGHT_UP_SHARE of the step (see BACKLOG_ROUNDS):
        batches prefetched during a pause would make the window's first seconds look faster than steady running."""
        if self.step is None or not self.settings.num_workers:
            return  # without a step the backlog goes at once; without workers there is none
        for _ in range(BACKLOG_ROUNDS * self.settings.batches_in_flight):
            delivered = len(self.rec.batches)
            self._roll(
                until=self.clock(), min_batches=1, give_up=give_up, epochs=epochs, share_epochs=False, steady=False
            )
            if len(self.rec.batches) == delivered or self.clock() >= give_up:
                return  # nothing more came: the run ended, or the time for warming up is spent
            last = self.rec.batches[-1]
            if last.index > 0 and last.wait_s >= CAUGHT_UP_SHARE * last.step_s:
                return

    def _epoch_start_s(self) -> float:
        """How long an epoch's start has taken in this run so far (a window waits that long, twice, for its
        steady batches): the first start-up, or an epoch's overhead where workers start every epoch."""
        return max(first_startup_s(self.rec) or 0.0, epoch_overhead_s(self.rec))

    def _roll(
        self,
        *,
        until: float,
        min_batches: int,
        epochs: int | None,
        share_epochs: bool,
        steady: bool,
        give_up: float | None = None,
    ) -> None:
        """Deliver batches, opening epochs as they end, until the clock passes `until` with `min_batches`
        delivered (only steady ones, not an epoch's first, if `steady`), or `give_up` passes, or `epochs` epochs
        ran, or the run failed."""
        delivered = 0
        while self.ran:
            now = self.clock()
            if (now >= until and delivered >= min_batches) or (give_up is not None and now >= give_up):
                return
            if self.iterator is None:
                if epochs is not None and self.epoch + 1 >= epochs:
                    return
                if not self._open_epoch():
                    return
            deadline = until
            if share_epochs and epochs is not None:
                deadline = now + (until - now) / max(1, epochs - self.epoch)
            ended, counted = self._consume(deadline, min_batches - delivered, give_up, steady)
            delivered += counted
            if ended is not None or share_epochs:
                self.end_epoch(ended or "time")
                if ended == "exhausted" and self.rec.epochs[-1].batches == 0:
                    return  # an empty epoch: nothing more to deliver

    def report_progress(self) -> None:
        if self.progress is not None:
            elapsed = self.clock() - self.started
            epochs = max(self.epoch + 1, 1)
            self.progress(ProbeProgress(self.epoch, epochs, len(self.rec.batches), elapsed, self.budget_s))

    def close(self) -> Recording:
        """End the workers and the watching; the Recording, complete. Safe to call more than once."""
        if self.closed:
            return self.rec
        try:
            self.held_batch = None
            if self.iterator is not None:
                self.last_step_end = self.clock()  # the pause since the last window is no part of the epoch's end
                self.end_epoch("time")
            if self.last_iterator is not None:
                close_iterator(self.last_iterator)  # persistent workers outlive their epochs' iterators
        finally:
            self.closed = True
            self.watchdog.stop()
            self.poller.stop()
            self.rec.worker_activity = read_worker_activity(self.dump_dir)  # the workers wrote it as they ended
            remove_folder(self.dump_dir)
        rec = self.rec
        rec.budget_s = self.budget_s
        rec.wall_s = self.clock() - self.started
        rec.worker_samples = list(self.poller.readings)
        rec.host_samples = list(self.poller.host_readings)
        self.other_load.observe()
        rec.other_processes = self.other_load.busiest(rec.wall_s)
        if self.step is not None and self.step_times:
            rec.step_s = statistics.median(self.step_times)
        forks = rec.start_method == "fork" or rec.settings.num_workers == 0
        # Where fork was hazardous, or the loader crashed (workers started with spawn may not have loaded it).
        if (forks and recorded_hazards(rec)) or rec.outcome != "completed":
            rec.forkserver_blocker = forkserver_blocker(self.spec)
        return rec
