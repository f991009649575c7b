"""GuardedLoader: a DataLoader whose stalled or dead workers are restarted one rung safer, resuming at the
first batch not yet delivered."""

from __future__ import annotations

import logging
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.guard import children
from loaderdoctor.guard.attributes import forward_loader_attributes
from loaderdoctor.guard.batchplan import check_resumable, start_epoch
from loaderdoctor.guard.checkpoint import Checkpoints
from loaderdoctor.guard.epoch import EpochIterator, EpochWorkers
from loaderdoctor.guard.events import GuardEvent
from loaderdoctor.guard.failures import FailureHandling
from loaderdoctor.guard.inner import Inner, Resources
from loaderdoctor.guard.options import check_sample_options, stall_policy
from loaderdoctor.guard.recovery import USERS_TIMEOUT
from loaderdoctor.guard.resume import Building, PlanResume, Resume, StreamResume
from loaderdoctor.guard.safe import SettingChange, StartSafety, persistent_workers_change
from loaderdoctor.guard.skipping import SkippedSamples
from loaderdoctor.guard.state import STATE_VERSION
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.recording.record import WorkerStack
from loaderdoctor.tap.events import Listener
from loaderdoctor.tap.interrupt import Interrupted, MainThreadInterrupter
from loaderdoctor.tap.iterator import RecentWaits, starts_workers
from loaderdoctor.tap.watchdog import StallPolicy

# Imported from here by callers and tests: kept where they always were.
__all__ = ["STATE_VERSION", "GuardedLoader", "stall_policy"]

log = logging.getLogger("loaderdoctor")

_MAIN_THREAD = threading.main_thread().ident


class GuardedLoader(FailureHandling, Checkpoints, SkippedSamples):
    """Iterates like the DataLoader it guards, batch for batch, and never hangs forever on its workers.

    A watchdog declares a stall when no batch comes for too long (`stall_timeout`: None for adaptive deadlines,
    seconds, or a StallPolicy); the guard then takes the stacks of what is stuck and ends it (stalls.py), and
    restarts one rung down the fallback ladder (guard/ladder.py, recovery.py) at the first batch not yet
    delivered. A worker that dies (SIGKILL, OOM killer, segfault) is met the same way, but loading never comes
    into the main process after a death. Without workers, a stalled next() in the main thread is interrupted and
    loading moves once to one spawned worker (recovery.after_main_stall). At most `max_restarts` restarts over
    the loader's life; past them, or with no rung left, a LoaderGaveUp (a RuntimeError) names the batch, the
    stuck frames and the settings tried. Every change is an event on `events`, and logged. One epoch at a time:
    iter() ends the epoch before.

    How an epoch resumes depends on the dataset (resume.py): a map-style one by its batch plan, drawn from the
    user's sampler as loading asks (guard/batchplan.py); an IterableDataset by its workers' stream states, when it
    offers state_dict() and load_state_dict() (guard/streams.py; without them the guard refuses it). A sample
    that fails to load is named in its own exception class (on_sample_error="raise") or replaced and recorded
    ("skip", map-style only; past `max_bad_fraction` at 99.9% confidence the run ends): see guard/samples.py.
    """

    def __init__(
        self,
        loader: DataLoader,
        *,
        stall_timeout: float | StallPolicy | None = None,
        max_restarts: int = 3,
        persistent_workers: bool | None = None,
        on_sample_error: str = "raise",
        max_bad_fraction: float = 0.01,
    ) -> None:
        if not isinstance(loader, DataLoader):
            kind = f"{type(loader).__module__}.{type(loader).__name__}"
            raise UsageError(f"guard() expects a torch.utils.data.DataLoader, got {kind}")
        check_resumable(loader)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise UsageError(f"max_restarts must be a whole number, 0 or more, not {max_restarts!r}")
        self._iterable = isinstance(loader.dataset, IterableDataset)
        check_sample_options(on_sample_error, max_bad_fraction, iterable=self._iterable)
        self._loader_changed = False  # the user set an attribute of the loader: re-read at the next iter()
        self._policy_option, self._persistent_option = stall_timeout, persistent_workers
        self.loader = loader
        self.max_restarts = max_restarts
        self.events: list[GuardEvent] = []
        self.restarts = 0
        self.on_sample_error = on_sample_error
        self.max_bad_fraction = float(max_bad_fraction)
        # The index of every sample replaced, in the order delivered: once each time it is met.
        self.skipped: list[int] = []
        self._samples_seen = 0  # samples delivered, over the loader's life, under on_sample_error="skip"
        self._iterations = 0
        self._user_persistent = bool(loader.persistent_workers and loader.num_workers)
        self.tried: list[Settings] = []  # every Settings an iterator was started with, in order
        self._epoch = -1
        self._position = 0  # the plan position of the next batch to deliver: the batches delivered this epoch
        self._resume: Resume = (
            StreamResume(loader) if self._iterable else PlanResume(loader, skip=on_sample_error == "skip")
        )
        self._exhausted = True  # no epoch is under way (an IterableDataset's end is known at StopIteration only)
        # Loading moved out of the main process after it stalled there (see _after_main_stall): the last rung.
        self._escalated = False
        self._retried_as_was = False  # see recovery.choose_rung
        self._active = False  # an epoch is under way
        self._resume_pending = False  # load_state_dict() set a plan and position for the next iter() to resume
        self._seed_state: torch.Tensor | None = None
        self._waits = RecentWaits()  # recent batch waits, over every internal loader: the watchdog's yardstick
        # Whoever listens to the batches (loaderdoctor.watch): every internal loader's tap reports to them.
        self.listeners: list[Listener] = []
        self._warned_fork = False
        self._consumer = threading.current_thread()
        # Set while the main thread is in this loader's next() of a num_workers=0 iterator: what ends it.
        self._main_interrupter: MainThreadInterrupter | None = None
        self._interrupter = MainThreadInterrupter()  # its handler in place only during such an epoch
        self._last_stacks: list[WorkerStack] = []
        self._last_loading: list[tuple[int, Any]] | None = None
        self._last_killer: int | None = None
        self._resources = Resources()
        self._epoch_workers = EpochWorkers()  # the current epoch's (see guard/epoch.py)
        weakref.finalize(self, self._resources.release)
        weakref.finalize(self, self._interrupter.uninstall)  # a loader dropped mid-epoch: its SIGUSR2 handler too
        self._read_loader()

    # The DataLoader's own attributes (dataset, batch_size, sampler, ...) read through.
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __len__(self) -> int:
        return len(self.loader)

    def torch_iterator(self) -> Any:
        """torch's iterator the guard reads from now (None before the first and after close)."""
        inner = self._inner
        return inner.torch_iterator() if inner is not None else None

    def held(self, worker_id: int) -> int | None:
        """The dataset index worker `worker_id` of the current iterator is loading (or was, as it died); None when
        unknown (an IterableDataset, no workers)."""
        inner = self._inner
        if inner is None or inner.in_hand is None:
            return None
        return inner.in_hand.read(worker_id)

    def __iter__(self) -> Iterator[Any]:
        self._end_epoch()
        if self._loader_changed:
            self._close_inner()
            self._read_loader()
        if self._resume_pending:
            self._resume_pending = False  # the loaded epoch, plan and position stand
        else:
            self._epoch += 1
            first = self._epoch == 0 and getattr(self.loader, "_iterator", None) is None
            plan = start_epoch(self.loader, draws_base_seed=first or not self._user_persistent)
            if plan.seed_state is not None:
                self._seed_state = plan.seed_state
            self._resume.start(plan)
            self._position = 0
        self._exhausted = False
        self._consumer = threading.current_thread()
        self._active = True
        self._epoch_workers = EpochWorkers()
        self._open()
        return EpochIterator(self, self._epoch, self._epoch_workers)

    def _read_loader(self) -> None:
        """Take the user's loader as it is now (at the start, and at the iter() after attributes were set on it):
        its spec, the watchdog's policy, and the settings with the guard's safe changes."""
        self._loader_changed = False
        self._spec = LoaderSpec.from_loader(self.loader)
        self.policy = stall_policy(self._policy_option, users_timeout_s=float(self.loader.timeout))
        settings = self._spec.settings
        if self._persistent_option is not None and settings.num_workers:
            settings = settings.replace(persistent_workers=self._persistent_option)
        self.settings = settings
        self._safety = StartSafety(self._spec)
        change = persistent_workers_change(settings, explicit=self._persistent_option is False)
        if change is not None:
            self._apply(change)

    def close(self) -> None:
        """End the workers now, persistent ones included; iterating again starts new ones."""
        self._active = False
        self._close_inner()
        self._resources.release()

    def __enter__(self) -> GuardedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, event: GuardEvent) -> None:
        self.events.append(event)
        log.log(logging.INFO if event.kind == "setting-changed" else logging.WARNING, "%s", event.message)

    def _apply(self, change: SettingChange) -> None:
        self.settings = change.apply(self.settings)
        self._record(
            GuardEvent(
                "setting-changed",
                max(self._epoch, 0),
                self._position,
                f"loaderdoctor guard: {change.setting} {change.before} -> {change.after}: {change.reason}",
                {"setting": change.setting, "before": change.before, "after": change.after, "reason": change.reason},
            )
        )

    def _safe_start(self) -> None:
        """Before workers start: forkserver instead of fork when what runs now could hang forked workers."""
        change = self._safety.change_now(self.settings)
        if change is None:
            return
        if change.kept:
            if not self._warned_fork:
                self._warned_fork = True
                if self._safety.explicit:
                    warnings.warn(change.reason, LoaderDoctorWarning, stacklevel=5)  # the user's for/iter() line
                else:
                    log.warning("loaderdoctor guard: %s", change.reason)
            return
        self._apply(change)

    def _build(self, settings: Settings) -> Inner:
        # The internal loader draws its workers' base seed from a copy of the user's generator taken just
        # before the plain DataLoader's draw: its workers get the seeds a plain DataLoader's would.
        device = self._spec.generator.device if self._spec.generator is not None else torch.device("cpu")
        generator = torch.Generator(device=device)
        if self._seed_state is not None:
            generator.set_state(self._seed_state)
        building = Building(self._spec, settings, generator, self._resources.stack_dir, self._waits, self.listeners)
        inner = self._resume.build(building)
        self._resources.inner = inner
        return inner

    def _start_iterator(self) -> None:
        """Make the current internal loader's iterator deliver plan[position:], watched by a new watchdog."""
        inner = self._inner
        if inner is not None and (inner.stalled or inner.died):
            # Noticed while the user was away from next(), or after the epoch before ended.
            self._recover("stall" if inner.stalled else "worker-died", None)
            inner = None
        if inner is not None and self._resume.stale(inner):
            self._close_inner()
            inner = None
        if self.settings.num_workers and (inner is None or starts_workers(inner.loader)):
            self._safe_start()
        if inner is not None and inner.settings != self.settings:
            self._close_inner()
            inner = None
        if inner is None:
            inner = self._build(self.settings)
        if not self.tried or self.tried[-1] != inner.settings:
            self.tried.append(inner.settings)
        self._iterations += 1
        inner.iteration = self._iterations
        self._resume.prepare(inner, self._position)
        if inner.settings.num_workers and starts_workers(inner.loader) and self._seed_state is not None:
            # New workers: their base seed is drawn from the state the plain DataLoader drew this epoch's from.
            inner.loader.generator.set_state(self._seed_state)
        inner.start = self._position
        self._watch(inner)
        if not inner.settings.num_workers:
            self._interrupter.install()  # while this epoch runs in the main process (main thread only)
        children.arm(inner)
        try:
            inner.iterator = inner.tap.epoch(self._epoch)
        finally:
            children.disarm()
        inner.pids = list(inner.iterator.pids)
        self._epoch_workers.processes = getattr(inner.torch_iterator(), "_workers", None)
        children.watch(inner.pids, inner)
        if inner.pids:
            children.install()  # after torch's SIGCHLD handler, which the first iterator with workers sets

    def _arm(self, inner: Inner, interrupter: MainThreadInterrupter | None) -> None:
        """For the time of one next(): the guard's watch on `inner`'s workers, and the watchdog's interrupter where
        it may end a stalled main-thread next()."""
        children.arm(inner)
        if interrupter is not None:
            interrupter.armed, self._main_interrupter = True, interrupter

    def _disarm(self, interrupter: MainThreadInterrupter | None) -> None:
        """next() over: both disarmed (twice is harmless, as where the interrupter's signal cut the first short)."""
        if interrupter is not None:
            interrupter.armed, self._main_interrupter = False, None
        children.disarm()

    def _open(self) -> None:
        while True:
            try:
                self._start_iterator()
                return
            except Exception as error:
                kind = self._failure(self._inner, error)
                if kind in (None, USERS_TIMEOUT):
                    self._active = False
                    self._close_inner()
                    raise
                self._recover(kind, error)

    def _next(self, epoch: int) -> Any:
        if epoch != self._epoch:
            raise UsageError(
                f"this iterator of epoch {epoch} was ended by iter() of epoch {self._epoch}",
                hint="a guarded loader runs one epoch at a time; use one iterator per epoch",
            )
        while True:
            inner = self._inner
            if not self._active or inner is None or inner.iterator is None:
                raise StopIteration
            if inner.stalled or inner.died:
                self._recover("stall" if inner.stalled else "worker-died", None)
                self._open()
                continue
            if inner.passed_a_batch:
                self._close_inner()  # begin again at the batch torch's iterator passed: none is lost
                self._open()
                continue
            interrupter = self._interrupter
            if inner.settings.num_workers or not interrupter.installed or threading.get_ident() != _MAIN_THREAD:
                interrupter = None  # only the main thread's next() can be interrupted, where its handler is
            try:
                self._arm(inner, interrupter)
                try:
                    batch = next(inner.iterator)
                finally:
                    self._disarm(interrupter)
            except StopIteration:
                self._exhausted = True
                self._end_epoch()
                raise
            except Interrupted:
                # The watchdog ended a main-process next() that stalled. The signal may have cut the finally
                # short: disarm again. Loading moves to a worker, or resumes here (see _after_main_stall).
                self._disarm(interrupter)
                self._recover("stall", None)
                self._open()
                continue
            except Exception as error:
                kind = self._failure(inner, error)
                if kind in (None, USERS_TIMEOUT):
                    if kind is None and inner.stream is None:
                        self._position += 1  # the loader's own error (a sample that raised): that batch is spent
                    raise
                self._recover(kind, error)
                self._open()
                continue
            except BaseException:
                # Ctrl-C (or SystemExit) inside a main-process next(): torch's iterator has passed the batch it was
                # loading, which would be lost (workers still deliver theirs); the next next() begins again at it.
                if not inner.settings.num_workers and inner.stream is None:
                    inner.passed_a_batch = True
                raise
            batch, planned = self._resume.delivered(batch, self._position)
            self._position += 1
            if inner.watchdog is not None and inner.watchdog.fired is not None and not inner.settings.num_workers:
                # A main-process stall that ended by itself: watch the next batches again.
                inner.watchdog.stop()
                self._watch(inner)
            if inner.reports is not None:
                self._count_samples(inner, self._position - 1, planned)
            return batch

    def _end_epoch(self) -> None:
        self._active = False
        self._interrupter.uninstall()
        inner = self._inner
        if inner is not None:
            inner.stop_watching()
            inner.end_iterator()

    def _close_inner(self) -> None:
        self._interrupter.uninstall()
        inner = self._inner
        if inner is not None:
            inner.close()
            self._resources.inner = None


forward_loader_attributes(GuardedLoader)
