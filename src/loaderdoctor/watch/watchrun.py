"""WatchRun: what a watch keeps apart from the WatchedLoader (its recorder, the workers' poller, the progress
lines), and the end of a watched run: its diagnosis logged and kept in the history."""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.guard.children import GuardInterrupt
from loaderdoctor.history.keep import keep_loader_run
from loaderdoctor.history.records import now_iso
from loaderdoctor.host.facts import OWN_THREAD_PREFIX
from loaderdoctor.host.snapshot import HostSnapshot, take_snapshot
from loaderdoctor.host.tempfolders import make_private_folder, remove_folder
from loaderdoctor.loader.facts import loader_facts
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.background import BackgroundThread
from loaderdoctor.plain.words import plural
from loaderdoctor.recording.limit import limit_words
from loaderdoctor.recording.rates import delivered_batches, training_rate
from loaderdoctor.recording.record import Recording
from loaderdoctor.report import LoaderReport
from loaderdoctor.rules import diagnose, order
from loaderdoctor.rules.finding import Finding
from loaderdoctor.tap import deathwatch
from loaderdoctor.tap.ceiling import Ceiling
from loaderdoctor.tap.events import EpochEnded, Event, IteratorCreated, WorkersStarted
from loaderdoctor.tap.iterator import is_worker_death
from loaderdoctor.watch.progress import Progress, epoch_line, progress_line
from loaderdoctor.watch.rankceilings import JobStore, job_ceiling_finding, job_store
from loaderdoctor.watch.recorder import RunRecorder, sampler_epoch
from loaderdoctor.workers.currentindex import InHand
from loaderdoctor.workers.deaths import oom_kills, worker_death

log = logging.getLogger("loaderdoctor")


class WatchRun:
    """What a watch keeps, apart from the WatchedLoader (so that its finalizer can end it): the recorder, the
    workers' poller, the thread that logs progress, and the end of the run."""

    def __init__(
        self,
        name: str,
        listeners: list[Callable[[Event], None]],
        user_loader: DataLoader,
        settings: Callable[[], Settings],
        *,
        epochs: int | None,
        cost_per_hour: float | None,
        history: bool,
        log_every_s: float,
        waiting_since: Callable[[], float | None],
        torch_iterator: Callable[[], Any],
        held: Callable[[int], int | None] = lambda worker_id: None,
        log_diagnosis: bool = True,
    ) -> None:
        self.name = name
        self.log_diagnosis = log_diagnosis
        self.listeners = listeners  # the tap's or the guard's: on_event joins them, and leaves them at close()
        self.settings = settings
        self.epochs = epochs
        self.cost_per_hour = cost_per_hour
        self.history = history
        self.log_every_s = log_every_s
        self.waiting_since = waiting_since
        self.started_at = now_iso()
        self.snapshot = take_snapshot()
        self.is_death = lambda error: is_worker_death(error, torch_iterator())
        oom_kills_before = oom_kills()
        self.recorder = RunRecorder(
            loader_facts(user_loader),
            settings(),
            sampler_epoch=lambda: sampler_epoch(user_loader),
            is_death=self.is_death,
            death=lambda epoch, index, error: worker_death(
                torch_iterator(), epoch, index, error, held=held, oom_kills_before=oom_kills_before
            ),
            oom_kills_before=oom_kills_before,
        )
        # Deaths told by the workers' ends themselves, wherever torch raises them (tap/deathwatch.py)
        self._torch_iterator, self._held = torch_iterator, held
        self._follower: deathwatch.Follower | None = None
        self._folder: str | None = None  # the watch's own, for the index each worker holds (in_hand_slots)
        recorder = self.recorder  # not self: a run and its poller holding each other would keep the loader
        self.poller = recorder.worker_poller(lambda: recorder.worker_pids)
        self._ticker = BackgroundThread(OWN_THREAD_PREFIX + "watch", self._tick, log_every_s)
        self._lock = threading.Lock()
        self._last_tick = (self.recorder.started, 0, 0.0, 0, 0.0)  # clock, batches, wait, samples, step
        self.running = False
        self.closed = False
        self.report: LoaderReport | None = None
        self.failed = False  # the recording broke: the loop goes on, unwatched
        self.ceiling: Ceiling | None = None  # the ceiling's turns' figures, when asked for: the ranks meet at close()
        self.job: JobStore | None = None  # in a distributed run with a ceiling, where the ranks meet
        self.epoch_ended: Callable[[], None] = lambda: None  # told after each epoch's end (run's ranks: a snapshot)

    def start(self) -> None:
        """At the first iter(): the poller and the progress lines begin."""
        if not self.running:
            self.running = True
            if self.ceiling is not None:
                self.job = _job_store()
            self._follower = deathwatch.follow(self._torch_iterator, self._held, self.recorder.note_end)
            self.poller.start()
            self._ticker.start()

    def on_event(self, event: Event) -> None:
        """The tap's listener: never lets a failure of its own reach the training loop."""
        if self.failed or self.closed:
            return
        try:
            self.recorder.on_event(event)
            if isinstance(event, EpochEnded):
                self._log_epoch_end(event)
                self.epoch_ended()
            elif isinstance(event, IteratorCreated | WorkersStarted) and event.worker_pids:
                deathwatch.workers_started()
        except Exception as error:
            # torch's SIGCHLD handler raises a worker's death wherever the main thread is, here too (and a guard's
            # handler its watchdog's interrupt): the loop's (the guard's) to handle, and the recording goes on. Any
            # other error is the watch's own: the run goes on unwatched rather than fail.
            if self.is_death(error):
                self.recorder.worker_died(getattr(event, "epoch", 0), getattr(event, "index", 0), error)
                raise
            if isinstance(error, GuardInterrupt):
                raise
            self.failed = True
            warnings.warn(
                f"loaderdoctor watch '{self.name}' stopped recording: {type(error).__name__}: {error}",
                LoaderDoctorWarning,
                stacklevel=2,
            )

    def in_hand_slots(self, num_workers: int) -> InHand | None:
        """Where each worker of the loader notes the index it is loading (in a folder of the watch's own, removed at
        close()); None when no folder can be made (a death then names no index)."""
        try:
            self._folder = self._folder or make_private_folder("loaderdoctor-watch-")
            return InHand(self._folder, num_workers)
        except OSError as error:
            log.debug("loaderdoctor watch '%s': no index in hand: %s", self.name, error)
            return None

    # Progress lines

    def _progress(self, stretch: tuple[float, int, float, int, float], now: float) -> Progress:
        recorder = self.recorder
        tally = recorder.tally or recorder.last_tally
        since, batches, wait_s, samples, step_s = stretch
        delivered = recorder.delivered - batches
        seconds = now - since
        wait = recorder.wait_s - wait_s
        busy = wait + recorder.step_s - step_s
        waiting = self.waiting_since()
        return Progress(
            name=self.name,
            epoch=tally.epoch if tally is not None else 0,
            epochs=self.epochs,
            batch=tally.batches if tally is not None else 0,
            batches_per_epoch=recorder.rec.batches_per_epoch,
            batches_per_s=delivered / seconds if delivered and seconds > 0 else None,
            samples_per_s=(self.recorder.samples - samples) / seconds if delivered and seconds > 0 else None,
            wait_share=wait / busy if delivered and busy > 0 else None,
            cost_per_hour=self.cost_per_hour,
            waiting_s=None if waiting is None or now - waiting < 1.0 else now - waiting,
        )

    def _stretch_now(self, now: float) -> tuple[float, int, float, int, float]:
        r = self.recorder
        return (now, r.delivered, r.wait_s, r.samples, r.step_s)

    def _tick(self) -> None:
        try:
            with self._lock:
                now = self.recorder.clock()
                line = progress_line(self._progress(self._last_tick, now))
                self._last_tick = self._stretch_now(now)
                self.recorder.other_load.observe()
            log.info("%s", line)
        except Exception as error:  # a progress line is not worth a training run
            log.debug("watch progress line failed: %s", error)

    def _log_epoch_end(self, event: EpochEnded) -> None:
        epochs = self.recorder.rec.epochs
        if not epochs:
            return
        record = epochs[-1]
        seconds = max(record.wall_s, 1e-9)
        tally = self.recorder.last_tally
        wait = tally.wait_s if tally is not None else 0.0
        busy = wait + (tally.step_s if tally is not None else 0.0)
        samples = tally.samples if tally is not None else 0
        progress = Progress(
            name=self.name,
            epoch=record.epoch,
            epochs=self.epochs,
            batch=record.batches,
            batches_per_epoch=self.recorder.rec.batches_per_epoch,
            batches_per_s=record.batches / seconds if record.batches else None,
            samples_per_s=samples / seconds if record.batches else None,
            wait_share=wait / busy if busy > 0 else None,
            cost_per_hour=self.cost_per_hour,
        )
        log.info("%s", epoch_line(progress, record.wall_s))

    # The end

    def close(self) -> LoaderReport | None:
        """Stop watching, diagnose the run, log the diagnosis and keep the run; the report (None when the
        recording broke, or nothing was iterated). Never raises: a failure here is a warning, and the training
        run goes on."""
        if self.closed:
            return self.report
        self.closed = True
        self._ticker.stop()
        self.poller.stop()
        if self._follower is not None:
            deathwatch.unfollow(self._follower)
        if self._folder is not None:
            remove_folder(self._folder)
        with contextlib.suppress(ValueError):
            self.listeners.remove(self.on_event)  # the tap (or guard) and this run held each other: now apart
        job = None
        if self.job is not None:  # every rank hands its ceiling, the main one has the job's (rankceilings.py)
            measured = self.ceiling if not self.failed else None
            key = self.name.removesuffix(f"/rank{self.job.rank}")  # watch() names each rank's its own
            job = job_ceiling_finding(measured, main=self.job.rank == 0, job=self.job, key=f"watch:{key}")
        if self.failed or not self.running:
            return None
        try:
            self.report = self._diagnose(job)
        except Exception as error:
            warnings.warn(
                f"loaderdoctor watch '{self.name}' could not finish: {type(error).__name__}: {error}",
                LoaderDoctorWarning,
                stacklevel=2,
            )
        return self.report

    def report_so_far(self) -> LoaderReport | None:
        """The diagnosis of the run so far, the run going on (its history not kept, nothing logged); None before the
        first iter(), once the recording broke, or when it cannot be had (said at debug level)."""
        if self.failed or not self.running or self.closed:
            return self.report
        try:
            rec = self.recorder.so_far(self.settings(), self.poller)
            return finish_run("watch", self.name, rec, self.started_at, self.snapshot, history=False, log_it=False)
        except Exception as error:  # the training goes on; the snapshot is left out
            log.debug("loaderdoctor watch '%s': no report so far: %s: %s", self.name, type(error).__name__, error)
            return None

    def _diagnose(self, job: Finding | None) -> LoaderReport:
        rec = self.recorder.finish(self.settings(), self.poller)
        return finish_run(
            "watch",
            self.name,
            rec,
            self.started_at,
            self.snapshot,
            history=self.history,
            log_it=self.log_diagnosis,
            job=job,
        )


def _job_store() -> JobStore | None:
    """The job's store as the loop begins, or None (a single process, or one the watch could not place: a warning)."""
    try:
        return job_store()
    except Exception as error:  # the job's figure is not worth the training run
        warnings.warn(
            f"loaderdoctor cannot meet the other ranks for the job's ceiling: {type(error).__name__}: {error}",
            LoaderDoctorWarning,
            stacklevel=3,
        )
        return None


def finish_run(
    kind: str,
    name: str,
    rec: Recording,
    started_at: str,
    snapshot: HostSnapshot,
    *,
    history: bool,
    log_it: bool = True,
    job: Finding | None = None,
) -> LoaderReport:
    """A watched run's end, for watch() and the Lightning callback alike: check's rules on its Recording (with
    `job`, the job's finding from every rank's, among them), the comparison with earlier runs of its name and the run
    kept in the history (with `history`), the diagnosis logged (with `log_it`: the Lightning callback prints its
    report instead). The report."""
    findings = diagnose(rec)
    report = LoaderReport(name, rec, order([*findings, job]) if job is not None else findings)
    if history:
        keep_loader_run(kind, report, started_at, snapshot.to_dict())
    if log_it:
        _log_diagnosis(kind, report)
    return report


def _log_diagnosis(kind: str, report: LoaderReport) -> None:
    rec = report.recording
    log.info("%s '%s': %s", kind, report.name, limit_words(report.limit, training_rate(rec)))
    if not report.findings:
        log.info("%s '%s': %s delivered, no finding", kind, report.name, plural(delivered_batches(rec), "batch"))
        return
    for finding in report.findings:
        level = logging.INFO if finding.severity == "info" else logging.WARNING
        log.log(level, "%s '%s': %s [%s] %s; fix: %s", kind, report.name, finding.severity, finding.rule,
                finding.title, finding.fix)  # fmt: skip
