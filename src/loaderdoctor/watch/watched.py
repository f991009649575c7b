"""watch(): a DataLoader (plain or guarded) observed in the user's own training loop, diagnosed at its end."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.guard.children import GuardInterrupt
from loaderdoctor.guard.loader import GuardedLoader
from loaderdoctor.history.keep import keep_loader_run
from loaderdoctor.history.records import now_iso
from loaderdoctor.host.facts import OWN_THREAD_PREFIX
from loaderdoctor.host.snapshot import HostSnapshot, take_snapshot
from loaderdoctor.loader.facts import loader_facts
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.plain.background import BackgroundThread
from loaderdoctor.plain.words import plural
from loaderdoctor.recording.limit import limit_words
from loaderdoctor.recording.rates import delivered_batches, training_rate
from loaderdoctor.recording.record import Recording
from loaderdoctor.report import LoaderReport
from loaderdoctor.rules import diagnose
from loaderdoctor.tap.ceiling import MIN_TURN_STEPS, CeilingTurns, turn_plan
from loaderdoctor.tap.iterator import EpochEnded, Event, Tap, is_worker_death
from loaderdoctor.watch.progress import Progress, epoch_line, progress_line
from loaderdoctor.watch.recorder import RunRecorder, sampler_epoch
from loaderdoctor.workers.deaths import oom_kills, worker_death

log = logging.getLogger("loaderdoctor")

DEFAULT_LOG_EVERY_S = 60.0


def watch(
    loader: DataLoader | GuardedLoader,
    name: str | None = None,
    *,
    epochs: int | None = None,
    cost_per_hour: float | None = None,
    history: bool = True,
    log_every_s: float = DEFAULT_LOG_EVERY_S,
    ceiling: bool | int = False,
    ceiling_only: bool = False,
) -> WatchedLoader:
    """`loader`, observed in the training loop that iterates it (`for batch in watch(loader): ...`): per batch
    the wait in next() and the step after it, per epoch its start-up and rate, the workers' memory and CPU in
    the background. Every `log_every_s` and at each epoch's end one line goes to the "loaderdoctor" logger (rate,
    wait share, ETA of the epoch and, with `epochs`, of the run; with `cost_per_hour`, what the wait costs).
    close() (or the end of a `with` block, garbage collection, or the interpreter's exit, whichever comes first)
    runs check's rules on what was measured, logs the diagnosis, and saves the run in the history (unless
    `history` is False). `name` (default: the file and line of this call) is what runs are compared by; in a
    distributed run each rank's is its own ("train/rank1").

    `ceiling` (True, or a number of steps; off by default) measures what the loop runs at with its input taken
    away: after the first epoch's start-up, for that many steps in turns (DEFAULT_STEPS with True) the loop is
    handed the batch it got last instead of a new one, then the loader goes on where it stopped. Those steps
    train on repeated batches: use it on a diagnostic run (see the README). With `ceiling_only`, the loop's next()
    ends it once the turns are done, by SystemExit(0) (loaderdoctor.tap.ceiling.CeilingMeasured)."""
    if name is None:
        caller = sys._getframe(1)
        name = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
    if isinstance(name, str) and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        name = f"{name}/rank{dist.get_rank()}"
    return WatchedLoader(
        loader,
        name,
        epochs=epochs,
        cost_per_hour=cost_per_hour,
        history=history,
        log_every_s=log_every_s,
        ceiling=ceiling,
        ceiling_only=ceiling_only,
    )


def _check_options(loader: Any, name: str, epochs: Any, cost_per_hour: Any, log_every_s: Any) -> None:
    if not isinstance(loader, (DataLoader, GuardedLoader)):
        kind = f"{type(loader).__module__}.{type(loader).__name__}"
        raise UsageError(
            f"watch() expects a torch.utils.data.DataLoader or a loaderdoctor.DataLoader, got {kind}",
            hint="pass the DataLoader itself: watch(loader), then iterate what watch() returns",
        )
    if not isinstance(name, str) or not name:
        raise UsageError(f"watch()'s name must be a non-empty string, not {name!r}")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise UsageError(f"epochs must be a whole number, 1 or more, not {epochs!r}")
    for option, value in (("cost_per_hour", cost_per_hour), ("log_every_s", log_every_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise UsageError(f"{option} must be a number, 0 or more, not {value!r}")
    if not log_every_s:
        raise UsageError("log_every_s must be more than 0 seconds")


def _ceiling_steps(ceiling: Any) -> int | bool | None:
    """The data-free steps asked for: False for none, None for the default number, else the number."""
    if ceiling is False:
        return False
    if ceiling is True:
        return None
    if isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 3:
        raise UsageError(f"ceiling must be True or a number of steps, 3 or more, not {ceiling!r}")
    return ceiling


def ceiling_turns(steps: int | None, settings: Settings, *, stop_when_done: bool = False) -> CeilingTurns:
    """The data-free turns of a loader with these settings: they start once the first epoch's workers have each
    delivered a batch and a few steady ones came, the same step on every rank of a job."""
    plan = turn_plan(steps, num_workers=settings.num_workers, prefetch_factor=settings.prefetch_factor)
    return CeilingTurns(plan, start_after=max(1, settings.num_workers) + MIN_TURN_STEPS, stop_when_done=stop_when_done)


class WatchRun:
    """What a watch keeps, apart from the WatchedLoader (so that its finalizer can end it): the recorder, the
    workers' sampler, the thread that logs progress, and the end of the run."""

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
                torch_iterator(), epoch, index, error, oom_kills_before=oom_kills_before
            ),
        )
        recorder = self.recorder  # not self: a run and its sampler holding each other would keep the loader
        self.sampler = recorder.worker_sampler(lambda: recorder.worker_pids)
        self._ticker = BackgroundThread(OWN_THREAD_PREFIX + "watch", self._tick, log_every_s)
        self._lock = threading.Lock()
        self._last_tick = (self.recorder.started, 0, 0.0, 0, 0.0)  # clock, batches, wait, samples, step
        self.running = False
        self.closed = False
        self.report: LoaderReport | None = None
        self.failed = False  # the recording broke: the loop goes on, unwatched

    def start(self) -> None:
        """At the first iter(): the sampler and the progress lines begin."""
        if not self.running:
            self.running = True
            self.sampler.start()
            self._ticker.start()

    def on_event(self, event: Event) -> None:
        """The tap's listener: never lets a failure of its own reach the training loop."""
        if self.failed or self.closed:
            return
        try:
            self.recorder.on_event(event)
            if isinstance(event, EpochEnded):
                self._log_epoch_end(event)
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
        self.sampler.stop()
        with contextlib.suppress(ValueError):
            self.listeners.remove(self.on_event)  # the tap (or guard) and this run held each other: now apart
        if self.failed or not self.running:
            return None
        try:
            self.report = self._diagnose()
        except Exception as error:
            warnings.warn(
                f"loaderdoctor watch '{self.name}' could not finish: {type(error).__name__}: {error}",
                LoaderDoctorWarning,
                stacklevel=2,
            )
        return self.report

    def _diagnose(self) -> LoaderReport:
        rec = self.recorder.finish(self.settings(), self.sampler)
        return finish_run(
            "watch", self.name, rec, self.started_at, self.snapshot, history=self.history, log_it=self.log_diagnosis
        )


def finish_run(
    kind: str, name: str, rec: Recording, started_at: str, snapshot: HostSnapshot, *, history: bool, log_it: bool = True
) -> LoaderReport:
    """A watched run's end, for watch() and the Lightning callback alike: check's rules on its Recording, the
    comparison with earlier runs of its name and the run kept in the history (with `history`), the diagnosis
    logged (with `log_it`: the Lightning callback prints its report instead). The report."""
    report = LoaderReport(name, rec, diagnose(rec))
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


class WatchedLoader:
    """Iterates as the loader it watches, batch for batch (its attributes read through); see watch()."""

    def __init__(
        self,
        loader: DataLoader | GuardedLoader,
        name: str,
        *,
        epochs: int | None = None,
        cost_per_hour: float | None = None,
        history: bool = True,
        log_every_s: float = DEFAULT_LOG_EVERY_S,
        open_iterator: Callable[[DataLoader], Any] = iter,
        log_diagnosis: bool = True,
        ceiling: bool | int = False,
        ceiling_only: bool = False,
    ) -> None:
        _check_options(loader, name, epochs, cost_per_hour, log_every_s)
        steps = _ceiling_steps(ceiling)
        self.loader = loader
        self.name = name
        self._epoch = -1
        guarded = loader if isinstance(loader, GuardedLoader) else None
        user_loader = guarded.loader if guarded is not None else loader
        if guarded is not None:
            self._tap = None
            settings: Callable[[], Settings] = lambda: guarded.settings  # noqa: E731
            waiting: Callable[[], float | None] = lambda: None  # noqa: E731
            inner: Callable[[], Any] = guarded.torch_iterator
        else:
            fixed = LoaderSpec.from_loader(loader).settings
            settings = lambda: fixed  # noqa: E731
            tap = self._tap = Tap(loader, [], start_method=fixed.effective_start_method, open_iterator=open_iterator)
            waiting = lambda: getattr(tap.current, "waiting_since", None)  # noqa: E731
            inner = tap.torch_iterator
        self._run = WatchRun(
            name,
            self._tap.listeners if self._tap is not None else guarded.listeners,  # type: ignore[union-attr]
            user_loader,
            settings,
            epochs=epochs,
            cost_per_hour=cost_per_hour,
            history=history,
            log_every_s=float(log_every_s),
            waiting_since=waiting,
            torch_iterator=inner,
            log_diagnosis=log_diagnosis,
        )
        self._run.listeners.append(self._run.on_event)
        if steps is not False:
            if self._tap is None:
                log.warning("loaderdoctor: %s is guarded: its ceiling is not measured (no data-free turns)", name)
            else:
                self._tap.ceiling = ceiling_turns(steps, fixed, stop_when_done=ceiling_only)
                self._run.recorder.rec.ceiling = self._tap.ceiling.ceiling  # filled in as the turns go by
        self._finalizer = weakref.finalize(self, self._run.close)

    def __iter__(self) -> Iterator[Any]:
        if not self._finalizer.alive:
            raise UsageError(
                f"the watch '{self.name}' was closed: its run is diagnosed and kept",
                hint="call watch(loader) again to watch a new run",
            )
        self._run.start()
        if self._tap is None:
            return iter(self.loader)
        self._epoch += 1
        return self._tap.epoch(self._epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("loader", "_run", "_tap", "_finalizer"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    @property
    def report(self) -> LoaderReport | None:
        """The diagnosis, once closed."""
        return self._run.report

    @property
    def started_at(self) -> str:
        """When the watch began (ISO 8601)."""
        return self._run.started_at

    @property
    def snapshot(self) -> HostSnapshot:
        """The host and this process when the watch began."""
        return self._run.snapshot

    def close(self) -> LoaderReport | None:
        """End the watch: diagnose the run so far, log it, keep it in the history. Safe to call again."""
        if self._finalizer.alive:
            return self._finalizer()
        return self._run.report

    def __enter__(self) -> WatchedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
