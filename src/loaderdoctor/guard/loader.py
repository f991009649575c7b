"""GuardedLoader: a DataLoader whose stalled or dead workers are restarted one rung safer, resuming at the
first batch not yet delivered."""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from loaderdoctor.errors import LoaderDoctorError, LoaderDoctorWarning, LoaderGaveUp, UsageError
from loaderdoctor.forksafety import ForkHazards, forkserver_blocker, iterator_facts
from loaderdoctor.guard import children
from loaderdoctor.guard.events import GuardEvent
from loaderdoctor.guard.inner import Inner, Resources
from loaderdoctor.guard.ladder import escalation, next_rung
from loaderdoctor.guard.options import check_sample_options, stall_policy
from loaderdoctor.guard.plan import (
    EpochPlan,
    PlannedBatchSampler,
    check_resumable,
    plan_generators,
    replayed,
    start_epoch,
)
from loaderdoctor.guard.safe import SettingChange, persistent_workers_change, start_method_change
from loaderdoctor.guard.samples import (
    BAD_SHARE_CONFIDENCE,
    GuardedSamples,
    SkipReports,
    Tagger,
    bad_share_floor,
    too_many_bad,
)
from loaderdoctor.guard.state import ITERABLE, STATE_VERSION, checked_state, checked_stream_state, dataset_length
from loaderdoctor.guard.streams import GuardedStream, StreamCollate, StreamRecord, StreamWorkerInit
from loaderdoctor.guard.texts import stuck_text
from loaderdoctor.guard.workerview import UsersDatasetHook
from loaderdoctor.interrupt import Interrupted, MainThreadInterrupter
from loaderdoctor.recording import WorkerStack
from loaderdoctor.settings import LoaderSpec, Settings
from loaderdoctor.tap import Tap, dead_worker_pids, is_worker_death, starts_workers
from loaderdoctor.watchdog import StallNotice, StallPolicy, Watchdog
from loaderdoctor.words import plural
from loaderdoctor.workers import StackDumpHook, dump_worker_stacks, kill_workers, thread_stack

# Imported from here by callers and tests: kept where they always were.
__all__ = ["STATE_VERSION", "GuardedLoader", "stall_policy"]

log = logging.getLogger("loaderdoctor")

_TIMED_OUT = "timed out after"  # torch's own error when the user's DataLoader(timeout=...) passes
_FROM_A_WORKER = "in DataLoader worker process"  # torch's re-raise of an exception the dataset raised in a worker
# A worker's death also shows as other errors (a batch whose shared memory cannot be fetched from it any more:
# ConnectionResetError, EOFError...); give a dying worker this long to be seen dead before blaming the user.
_DEATH_GRACE_S = 0.5
_INDICES_SHOWN = 20  # bad sample indices named in the error that ends a run with too many


def _on_stall_of(guarded: GuardedLoader, inner: Inner) -> Callable[[StallNotice], None]:
    # The watchdog's thread holds this callback: a weak reference lets an abandoned loader be collected.
    ref = weakref.ref(guarded)

    def on_stall(notice: StallNotice) -> None:
        loader = ref()
        if loader is not None:
            loader._stall(inner, notice)

    return on_stall


class GuardedLoader:
    """Iterates like the DataLoader it guards, batch for batch, and never hangs forever on its workers.

    Each epoch's batches are drawn once from the user's sampler (the batch plan). A watchdog declares a stall
    when no batch comes for too long (`stall_timeout`: None for adaptive deadlines, seconds, or a
    StallPolicy); the guard then takes the workers' stacks, kills them, and restarts one rung down the
    fallback ladder at the first batch not yet delivered. A worker that dies (SIGKILL, OOM killer, segfault)
    is met the same way. At most `max_restarts` restarts over the loader's life; past them a
    LoaderDoctorError names the batch, the stuck frames and the settings tried. Every change is an event
    on `events`, and logged. One epoch at a time: iter() ends the epoch before.

    A sample the dataset fails to load (see guard/samples.py for the exact rules): with
    on_sample_error="raise" the batch raises an error of the sample's own exception class naming its index,
    with the original traceback; with "skip" it is replaced by the next index that loads, a "sample-skipped"
    event records it and `skipped` lists its index, and once the samples seen (over the loader's life) show a bad
    share over `max_bad_fraction` at BAD_SHARE_CONFIDENCE (see too_many_bad), a LoaderDoctorError naming them
    ends the run.

    Without workers (num_workers=0) loading runs in the main process: on a stall the guard takes the main thread's
    stack and, when next() runs in the main thread, interrupts the stuck next() (with SIGUSR2, whose handler is in
    place only while such an epoch runs, raises only inside the guard's next(), and passes any SIGUSR2 it did not
    send to the handler that was there before). Then, counted as a restart, loading moves up to one worker started
    with spawn (not persistent: each epoch reads the dataset as the main process holds it, as loading there did),
    which the guard can end if it stalls again, and resumes at the first batch not yet delivered. That worker is the
    last rung: should it fail too, a LoaderDoctorError ends the run, so loading never goes back and forth between
    the main process and a worker (nor goes up at all when a single spawned worker was tried before). When the
    dataset or its functions cannot be pickled for a spawned worker, loading resumes in the main process instead, up
    to max_restarts times. Either way the error, once it comes, names the epoch, the batch, the stuck frame
    (file:line) and the settings tried. When next() runs in another thread, which no signal can interrupt, the stall
    is only recorded and logged, and the guard waits.

    An IterableDataset is guarded when it offers state_dict() and load_state_dict() (see guard/streams.py for
    what they must do); without them the guard refuses it with a UsageError, since a restart would repeat or
    drop samples. It has no batch plan: each batch carries, from the process that loaded it, its worker's id and
    the dataset's state_dict() right after its samples; the guard hands the user the batch alone and keeps, per
    worker, the state of the last batch delivered. A restart loads each new worker with the state of the stream
    it continues and shows it the worker id of that stream, rotated so that the deal goes on with the worker
    after the one delivered last: the plain loader's batches in the plain loader's order. As the states are per
    worker, the ladder keeps the number of workers: fork -> forkserver -> spawn, then a LoaderDoctorError; only a
    single worker goes on to num_workers=0, the main process iterating the same one stream. len() is the plain
    loader's (the dataset's __len__, if it has one). An error the dataset's iterator raises reaches the user as
    with the plain loader; on_sample_error="skip", which replaces a sample by index, is refused.
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
        self.policy = stall_policy(stall_timeout, users_timeout_s=float(loader.timeout))
        self.max_restarts = max_restarts
        self.events: list[GuardEvent] = []
        self.restarts = 0
        self.on_sample_error = on_sample_error
        self.max_bad_fraction = float(max_bad_fraction)
        # The index of every sample replaced, in the order delivered: once each time it is met.
        self.skipped: list[int] = []
        self._samples_seen = 0  # samples delivered, over the loader's life, under on_sample_error="skip"
        self._iterations = 0
        self._spec = LoaderSpec.from_loader(loader)
        self._explicit_start = self._spec.settings.start_method is not None
        self._user_persistent = bool(loader.persistent_workers and loader.num_workers)
        settings = self._spec.settings
        if persistent_workers is not None and settings.num_workers:
            settings = settings.replace(persistent_workers=persistent_workers)
        self.settings = settings
        self.tried: list[Settings] = []  # every Settings an iterator was started with, in order
        self._epoch = -1
        self._plan = EpochPlan(None, length=0)
        self._position = 0  # the plan position of the next batch to deliver: the batches delivered this epoch
        # Over an IterableDataset: the state of each worker's stream after its last batch delivered this epoch.
        self._streams = StreamRecord()
        self._exhausted = True  # over an IterableDataset: no epoch is under way (its end is known at StopIteration)
        # Loading moved out of the main process after it stalled there (see _after_main_stall): the last rung.
        self._escalated = False
        self._active = False  # an epoch is under way
        self._resume_pending = False  # load_state_dict() set a plan and position for the next iter() to resume
        self._seed_state: torch.Tensor | None = None
        self._slowest_wait_s = 0.0
        self._blocker_known = False
        self._blocker_text: str | None = None
        self._warned_fork = False
        self._consumer = threading.current_thread()
        # Set while the main thread is in this loader's next() of a num_workers=0 iterator: what ends it.
        self._main_interrupter: MainThreadInterrupter | None = None
        self._interrupter = MainThreadInterrupter()  # its handler in place only during such an epoch
        self._last_stacks: list[WorkerStack] = []
        self._resources = Resources()
        weakref.finalize(self, self._resources.release)
        change = persistent_workers_change(settings, explicit=persistent_workers is False)
        if change is not None:
            self._apply(change)

    # The DataLoader's own attributes (dataset, batch_size, sampler, ...) read through.
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """The DataLoader's own attributes are set on it, as torch sets them (a ValueError for those torch fixes
        after construction: batch_size, sampler, dataset...); the others (collate_fn, num_workers, timeout...)
        apply from the next iter() on, as with torch's DataLoader."""
        loader = self.__dict__.get("loader")
        if loader is None or name.startswith("_") or name in self.__dict__ or not _is_loader_attribute(loader, name):
            object.__setattr__(self, name, value)
            return
        setattr(loader, name, value)
        self._loader_changed = True

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self._end_epoch()
        if self._loader_changed:
            self._reread_loader()
        if self._resume_pending:
            self._resume_pending = False  # the loaded epoch, plan and position stand
        else:
            self._epoch += 1
            first = self._epoch == 0 and getattr(self.loader, "_iterator", None) is None
            plan = start_epoch(self.loader, draws_base_seed=first or not self._user_persistent)
            if plan.seed_state is not None:
                self._seed_state = plan.seed_state
            self._plan, self._position = plan, 0
            self._streams.reset()
        self._exhausted = False
        self._consumer = threading.current_thread()
        self._active = True
        self._open()
        return _EpochIterator(self, self._epoch)

    def _reread_loader(self) -> None:
        """Take the user's loader as it is now, after attributes were set on it: new settings (the guard's safe
        changes made again) and a new internal loader at this iter()."""
        self._loader_changed = False
        self._close_inner()
        self._spec = LoaderSpec.from_loader(self.loader)
        self._explicit_start = self._spec.settings.start_method is not None
        self.policy = stall_policy(self._policy_option, users_timeout_s=float(self.loader.timeout))
        settings = self._spec.settings
        if self._persistent_option is not None and settings.num_workers:
            settings = settings.replace(persistent_workers=self._persistent_option)
        self.settings = settings
        self._blocker_known = False
        change = persistent_workers_change(settings, explicit=self._persistent_option is False)
        if change is not None:
            self._apply(change)

    def close(self) -> None:
        """End the workers now, persistent ones included; iterating again starts new ones."""
        self._active = False
        self._close_inner()
        self._resources.release()

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as plain JSON-ready data, for load_state_dict() on a loader built the same
        way, whose next iter() then resumes at the first batch not yet delivered.

        "epoch" is the epoch the next batch belongs to. Mid-epoch ("epoch_started": true), "position" counts its
        batches delivered, "generators" holds the state that each generator the plans are drawn from (by where
        it sits on the loader, see plan_generators) had when the epoch began drawing its batches, and
        "global_generator" torch's global generator's state then: load_state_dict() draws the epoch again from
        there up to the position, so the state stays small whatever the dataset's length (a CPU generator's
        state is 5056 ints from 0 to 255), and an endless sampler resumes too. Between epochs
        ("epoch_started": false) "position" is 0, "generators" holds their states now and "global_generator"
        is None. "seed_state" holds the state the workers' base seed is drawn from. Then the restart count,
        `skipped` and the samples seen by the bad-sample budget, which go on counting after a resume.

        Over an IterableDataset the state has "dataset": "iterable" and no plan: "position" counts the epoch's
        batches delivered, "worker_states" maps each worker id (as a string; "0" for loading in the main
        process) to its stream's state_dict() right after its last batch delivered (None between epochs),
        "last_worker" names the stream delivered last (the next batch comes from the one after it), and
        "num_workers" the workers the streams belong to; the generators, the seed state and the restart count
        as above. It is JSON-ready when the dataset's own states are.
        """
        if self._iterable:
            return self._stream_state()
        mid_epoch = self._mid_epoch()
        generators = (
            self._plan.start_states
            if mid_epoch
            else {place: g.get_state() for place, g in plan_generators(self.loader).items()}
        )
        global_state = self._plan.global_state if mid_epoch else None
        return {
            "version": STATE_VERSION,
            "dataset_length": dataset_length(self.loader),
            "batch_size": self.loader.batch_size,
            "epoch": self._epoch if mid_epoch else self._epoch + 1,
            "position": self._position if mid_epoch else 0,
            "epoch_started": mid_epoch,
            "generators": {place: state.tolist() for place, state in generators.items()},
            "global_generator": None if global_state is None else global_state.tolist(),
            "seed_state": None if self._seed_state is None else self._seed_state.tolist(),
            "restarts": self.restarts,
            "skipped": list(self.skipped),
            "samples_seen": self._samples_seen,
        }

    def _mid_epoch(self) -> bool:
        """Whether an epoch has begun and has batches left to deliver."""
        return self._epoch >= 0 and not self._exhausted and not self._plan.ends_at(self._position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iter() resume where `state` (from state_dict()) was taken: the batches not yet
        delivered, in their order, then the later epochs as the saved loader would have drawn them.

        Ends any epoch under way and its workers. A UsageError, changing nothing, when the state is of
        another version, malformed, or from a loader that differs (dataset length, batch size, generators;
        over an IterableDataset, mid-epoch, the number of workers: 0 and 1 are both one stream).
        """
        if self._iterable:
            self._load_stream_state(state)
            return
        checked = checked_state(state, self.loader)
        plan = None
        if checked["epoch_started"]:
            before = {place: g.get_state() for place, g in plan_generators(self.loader).items()}
            try:
                plan = replayed(
                    self.loader,
                    checked["generators"],
                    checked["global_generator"],
                    checked["position"],
                    checked["seed_state"],
                )
            except UsageError:
                for place, generator in plan_generators(self.loader).items():
                    generator.set_state(before[place])  # refused: nothing changed
                raise
        self._end_epoch()
        self._close_inner()  # the next workers start from the loaded seed state
        self._seed_state = checked["seed_state"]
        self.restarts = checked["restarts"]
        self.skipped = list(checked["skipped"])
        self._samples_seen = checked["samples_seen"]
        epoch, position = checked["epoch"], checked["position"]
        self._resume_pending = plan is not None
        if plan is None:
            for place, generator in plan_generators(self.loader).items():
                generator.set_state(checked["generators"][place])
            self._epoch, self._plan, self._position, self._exhausted = epoch - 1, EpochPlan(None, length=0), 0, True
            log.info("loaderdoctor guard: state loaded: the next iter() starts epoch %d", epoch)
            return
        self._plan, self._epoch, self._position, self._exhausted = plan, epoch, position, False
        of = "" if plan.length is None else f" of {plan.length}"
        log.info(
            "loaderdoctor guard: state loaded: the next iter() resumes epoch %d at batch %d%s", epoch, position, of
        )

    def _stream_state(self) -> dict[str, Any]:
        """state_dict() over an IterableDataset."""
        mid_epoch = self._epoch >= 0 and not self._exhausted
        return {
            "version": STATE_VERSION,
            "dataset": ITERABLE,
            "dataset_length": dataset_length(self.loader),
            "batch_size": self.loader.batch_size,
            "num_workers": self.settings.num_workers,
            "epoch": self._epoch if mid_epoch else self._epoch + 1,
            "position": self._position if mid_epoch else 0,
            "last_worker": self._streams.last if mid_epoch else None,
            "worker_states": {str(stream): copy.deepcopy(s) for stream, s in sorted(self._streams.states.items())}
            if mid_epoch
            else None,
            "generators": {place: g.get_state().tolist() for place, g in plan_generators(self.loader).items()},
            "seed_state": None if self._seed_state is None else self._seed_state.tolist(),
            "restarts": self.restarts,
        }

    def _load_stream_state(self, state: dict[str, Any]) -> None:
        """load_state_dict() over an IterableDataset."""
        checked = checked_stream_state(state, self.loader, self.settings.num_workers)
        self._end_epoch()
        self._close_inner()  # the next workers start from the loaded seed state and streams
        for place, generator in plan_generators(self.loader).items():
            generator.set_state(checked["generators"][place])
        self._seed_state = checked["seed_state"]
        self.restarts = checked["restarts"]
        epoch, states = checked["epoch"], checked["worker_states"]
        self._plan = EpochPlan(None, length=0)
        self._resume_pending = states is not None
        if states is None:
            self._epoch, self._position, self._exhausted = epoch - 1, 0, True
            self._streams.reset()
            log.info("loaderdoctor guard: state loaded: the next iter() starts epoch %d", epoch)
        else:
            self._epoch, self._position, self._exhausted = epoch, checked["position"], False
            self._streams.restore(states, checked["last_worker"])
            log.info(
                "loaderdoctor guard: state loaded: the next iter() resumes epoch %d after %s, the streams of "
                "workers %s where their last batch delivered left them",
                epoch,
                plural(self._position, "batch"),
                ", ".join(map(str, sorted(states))) or "none",
            )

    def __enter__(self) -> GuardedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _inner(self) -> Inner | None:
        return self._resources.inner

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

    def _blocker(self) -> str | None:
        """Why workers that do not fork could not load this loader (cached); None when they could."""
        if not self._blocker_known:
            self._blocker_known = True
            self._blocker_text = forkserver_blocker(self._spec)
            if self._blocker_text is not None:
                log.warning("loaderdoctor guard: only forked workers can load this loader: %s", self._blocker_text)
        return self._blocker_text

    def _picklable(self) -> bool:
        """Whether workers started with forkserver or spawn can load the dataset and its functions."""
        return self._blocker() is None

    def _safe_start(self) -> None:
        """Before workers start: forkserver instead of fork when what runs now could hang forked workers."""
        if self.settings.effective_start_method != "fork":
            return
        hazards = ForkHazards.of([iterator_facts(self._epoch, "fork")])
        if not hazards:
            return
        blocker = None if self._explicit_start else self._blocker()
        change = start_method_change(self.settings, hazards, explicit=self._explicit_start, blocker=blocker)
        if change is None:
            return
        if change.kept:
            if not self._warned_fork:
                self._warned_fork = True
                if self._explicit_start:
                    warnings.warn(change.reason, LoaderDoctorWarning, stacklevel=5)  # the user's for/iter() line
                else:
                    log.warning("loaderdoctor guard: %s", change.reason)
            return
        self._apply(change)

    def _build(self, settings: Settings) -> Inner:
        spec = self._spec
        # The internal loader draws its workers' base seed from a copy of the user's generator taken just
        # before the plain DataLoader's draw: its workers get the seeds a plain DataLoader's would.
        device = spec.generator.device if spec.generator is not None else torch.device("cpu")
        generator = torch.Generator(device=device)
        if self._seed_state is not None:
            generator.set_state(self._seed_state)
        hook = StackDumpHook(self._resources.stack_dir()) if settings.num_workers else None
        if self._iterable:
            stream = GuardedStream(spec.dataset)
            spec = dataclasses.replace(
                spec,
                generator=generator,
                collate_fn=StreamCollate(spec.collate_fn, stream),
                worker_init_fn=StreamWorkerInit(spec.worker_init_fn, stream),
            )
            loader = spec.build(settings, dataset=stream, worker_hook=UsersDatasetHook(hook, stream.inner))
            tap = Tap(loader, [], start_method=settings.effective_start_method)
            tap.slowest_wait_s = self._slowest_wait_s
            inner = Inner(loader, None, settings, tap, stream=stream)
            self._resources.inner = inner
            return inner
        sampler = PlannedBatchSampler()
        planned = {"batch_sampler": sampler} if spec.batch_sampler is not None else {"sampler": sampler}
        spec = dataclasses.replace(spec, generator=generator, **planned)
        reports = SkipReports(self._resources.stack_dir()) if self.on_sample_error == "skip" else None
        dataset = GuardedSamples(spec.dataset, None if reports is None else reports.path)
        loader = spec.build(settings, dataset=dataset, worker_hook=UsersDatasetHook(hook, dataset.inner))
        tap = Tap(loader, [], start_method=settings.effective_start_method)
        tap.slowest_wait_s = self._slowest_wait_s
        inner = Inner(loader, sampler, settings, tap, reports)
        self._resources.inner = inner
        return inner

    def _start_iterator(self) -> None:
        """Make the current internal loader's iterator deliver plan[position:], watched by a new watchdog."""
        inner = self._inner
        if inner is not None and (inner.stalled or inner.died):
            # Noticed while the user was away from next(), or after the epoch before ended.
            self._recover("stall" if inner.stalled else "worker-died", None)
            inner = None
        rotation = self._streams.rotation(self.settings.num_workers)
        if inner is not None and inner.stream is not None and inner.settings.num_workers:
            alive = not starts_workers(inner.loader)  # persistent workers, kept from the epoch before
            if alive and (inner.rotation != rotation or self._streams.states):
                # They were started as other streams, or to resume them: new workers deal from worker 0.
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
        if inner.sampler is not None:
            tag = None if inner.reports is None else Tagger(inner.iteration)
            inner.sampler.replan(self._plan, self._position, tag)
        if inner.stream is not None and (not inner.settings.num_workers or starts_workers(inner.loader)):
            # What the iterator's new workers (or the main process) resume from: see guard/streams.py.
            inner.stream.rotation = inner.rotation = rotation
            inner.stream.resume = dict(self._streams.states) or None
        if inner.settings.num_workers and starts_workers(inner.loader) and self._seed_state is not None:
            # New workers: their base seed is drawn from the state the plain DataLoader drew this epoch's from.
            inner.loader.generator.set_state(self._seed_state)
        inner.start = self._position
        inner.watchdog = Watchdog(inner.tap, self.policy, _on_stall_of(self, inner)).start()
        if not inner.settings.num_workers:
            self._interrupter.install()  # while this epoch runs in the main process (main thread only)
        children.arm(inner)
        try:
            inner.iterator = inner.tap.epoch(self._epoch)
        finally:
            children.disarm()
        inner.pids = list(inner.iterator.pids)
        children.watch(inner.pids, inner)
        if inner.pids:
            children.install()  # after torch's SIGCHLD handler, which the first iterator with workers sets

    def _open(self) -> None:
        while True:
            try:
                self._start_iterator()
                return
            except Exception as error:
                kind = self._failure(self._inner, error)
                if kind is None:
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
            interrupter = self._interrupter
            if inner.settings.num_workers or not (interrupter.installed and interrupter.available):
                interrupter = None
            try:
                children.arm(inner)
                if interrupter is not None:
                    interrupter.armed, self._main_interrupter = True, interrupter
                try:
                    batch = next(inner.iterator)
                finally:
                    if interrupter is not None:
                        interrupter.armed, self._main_interrupter = False, None
                    children.disarm()
            except StopIteration:
                self._exhausted = True
                self._end_epoch()
                raise
            except Interrupted:
                # The watchdog ended a main-process next() that stalled. The signal may have cut the finally
                # short: disarm again. Loading moves to a worker, or resumes here (see _after_main_stall).
                if interrupter is not None:
                    interrupter.armed, self._main_interrupter = False, None
                children.disarm()
                self._recover("stall", None)
                self._open()
                continue
            except Exception as error:
                kind = self._failure(inner, error)
                if kind is None:
                    if inner.stream is None and not self._users_timeout(inner, error):
                        self._position += 1  # the loader's own error (a sample that raised): that batch is spent
                    raise
                self._recover(kind, error)
                self._open()
                continue
            if inner.stream is not None:
                batch = self._streams.delivered(batch)  # the user's batch; its stream's state kept
            planned = self._plan.delivered(self._position)
            self._position += 1
            if inner.watchdog is not None and inner.watchdog.fired is not None and not inner.settings.num_workers:
                # A main-process stall that ended by itself: watch the next batches again.
                inner.watchdog.stop()
                inner.watchdog = Watchdog(inner.tap, self.policy, _on_stall_of(self, inner)).start()
            if inner.reports is not None:
                self._count_samples(inner, self._position - 1, planned)
            return batch

    def _count_samples(self, inner: Inner, position: int, planned: Any) -> None:
        """Record the samples replaced in the batch at `position` (of the indices `planned`), just delivered;
        end the run when too many of the samples seen so far were bad."""
        self._samples_seen += len(planned) if self._spec.batch_sampler is not None else 1
        reports = inner.reports.take((inner.iteration, position))
        for report in reports:
            index = report["index"]
            self.skipped.append(index)
            self._record(
                GuardEvent(
                    "sample-skipped",
                    self._epoch,
                    position,
                    f"loaderdoctor guard: sample {index} skipped at epoch {self._epoch}, batch {position}: "
                    f"{report['error_type']}: {report['message']}; sample {report['replacement']} loaded in "
                    "its place",
                    {
                        "index": index,
                        "replacement": report["replacement"],
                        "error_type": report["error_type"],
                        "message": report["message"],
                        "traceback": report["traceback"],
                    },
                )
            )
        # The bound on the bad share rises only with a new bad sample: checked then.
        if reports and too_many_bad(len(self.skipped), self._samples_seen, self.max_bad_fraction):
            self._end_epoch()
            raise self._too_many_bad(position)

    def _end_epoch(self) -> None:
        self._active = False
        self._interrupter.uninstall()
        inner = self._inner
        if inner is not None:
            inner.stop_watching()
            inner.end_iterator()
            self._slowest_wait_s = max(self._slowest_wait_s, inner.tap.slowest_wait_s)

    def _close_inner(self) -> None:
        self._interrupter.uninstall()
        inner = self._inner
        if inner is not None:
            self._slowest_wait_s = max(self._slowest_wait_s, inner.tap.slowest_wait_s)
            inner.close()
            self._resources.inner = None

    def _failure(self, inner: Inner | None, error: BaseException) -> str | None:
        """What the guard recovers from in `error`: "stall", "worker-died", or None (the user's to see)."""
        if inner is None:
            return None
        if isinstance(error, children.GuardInterrupt) or inner.stalled:
            return "stall"
        if self._users_timeout(inner, error):
            return None  # torch's own error, as the plain DataLoader raises it: the user chose that deadline
        if is_worker_death(error):
            pids = dead_worker_pids(error)
            if pids and not set(pids) & set(inner.pids):
                return None  # another loader's worker
            return "worker-died"
        if inner.died:
            return "worker-died"
        if inner.settings.num_workers and _FROM_A_WORKER not in str(error):
            dead = inner.dead_workers(_DEATH_GRACE_S)
            if dead:
                inner.died = (
                    f"DataLoader worker (pid(s) {', '.join(map(str, dead))}) exited: {type(error).__name__}: {error}"
                )
                return "worker-died"
        return None

    def _users_timeout(self, inner: Inner, error: BaseException) -> bool:
        """Whether `error` is torch's when the user's own DataLoader(timeout=...) passed."""
        return bool(inner.settings.num_workers and self._spec.timeout) and (
            isinstance(error, RuntimeError) and _TIMED_OUT in str(error)
        )

    def _stall(self, inner: Inner, notice: StallNotice) -> None:
        """From the watchdog's thread: take the stuck workers' stacks, record the stall, end the workers."""
        if notice.pids:
            stacks = dump_worker_stacks(notice.pids, self._resources.stack_dir())
        else:
            stacks = [thread_stack(self._consumer)]
        self._last_stacks = stacks
        batch = inner.start + notice.batch
        where = stuck_text(stacks)
        interrupter = None if notice.pids else self._main_interrupter
        if notice.pids:
            then = f"ending workers {', '.join(map(str, notice.pids))} to restart"
        elif interrupter is not None:
            then = "loading runs in the main process: interrupting it"
        else:
            then = (
                "loading runs in the main process outside the main thread's next(), where the guard cannot "
                "interrupt it, so it waits on"
            )
        self._record(
            GuardEvent(
                "stall",
                notice.epoch,
                batch,
                f"loaderdoctor guard: stall at epoch {notice.epoch}, batch {batch}: {notice.reason}; "
                f"stuck at {where}; {then}",
                {
                    "waited_s": round(notice.waited_s, 3),
                    "threshold_s": round(notice.threshold_s, 3),
                    "reason": notice.reason,
                    "pids": list(notice.pids),
                    "settings": inner.settings.to_dict(),
                    "stacks": [
                        {
                            "pid": s.pid,
                            "stuck_frame": None if (frame := s.stuck_frame) is None else str(frame),
                            "frames": [str(f) for f in s.frames],
                        }
                        for s in stacks
                    ],
                },
            )
        )
        if notice.pids:
            kill_workers(notice.pids)
            # The blocked next() ends at once: by torch's SIGCHLD handler for forked workers, by this one for
            # the others (torch would notice only at its next 5 s check).
            children.interrupt(inner)
        elif interrupter is not None and not interrupter.interrupt():
            log.error("loaderdoctor guard: SIGUSR2 has another handler now: the stuck next() cannot be interrupted")

    def _recover(self, kind: str, error: BaseException | None) -> None:
        """End the failed iterator and step one rung down the ladder (after a main-process stall: up to a worker,
        see _after_main_stall), or raise when no restart or rung is left."""
        inner = self._inner
        failed = inner.settings if inner is not None else self.settings
        if kind == "worker-died":
            if error is not None and is_worker_death(error):
                cause = str(error)
            elif inner is not None and inner.died is not None:
                cause = inner.died + (" (seen between batches)" if error is None else "")
            else:
                cause = f"{type(error).__name__}: {error}"
            self._record(
                GuardEvent(
                    "worker-died",
                    self._epoch,
                    self._position,
                    f"loaderdoctor guard: worker died at epoch {self._epoch}, batch {self._position}: {cause}",
                    {"error": cause, "pids": dead_worker_pids(cause)},
                )
            )
        self._close_inner()
        rung, why = None, ""
        if self.restarts < self.max_restarts and not self._escalated:
            if failed.num_workers == 0:
                rung, why = self._after_main_stall(failed) if kind == "stall" else (None, "")
            else:
                picklable = failed.effective_start_method != "fork" or self._picklable()
                rung = next_rung(failed, kind, picklable=picklable, per_worker_streams=self._iterable)
        if rung is None:
            self._active = False
            self._resources.release()  # no worker and no stack-dump folder left behind
            raise self._gave_up(kind, error) from error
        escalated = failed.num_workers == 0 and rung.num_workers > 0
        self._escalated = self._escalated or escalated
        self.restarts += 1
        self.settings = rung
        how = f"with {rung.describe()} (was {failed.describe()})" if rung != failed else f"again with {rung.describe()}"
        detail: dict[str, Any] = {
            "reason": kind,
            "restart": self.restarts,
            "resume_at": self._position,
            "before": failed.to_dict(),
            "after": rung.to_dict(),
            "escalated": escalated,
        }
        where = self._at()
        if self._iterable:
            where += " (each worker's stream right after its last batch delivered)"
            detail["streams"] = {
                "resumed": sorted(self._streams.states),
                "first": self._streams.rotation(rung.num_workers),
            }
        self._record(
            GuardEvent(
                "restart",
                self._epoch,
                self._position,
                f"loaderdoctor guard: restart {self.restarts} of at most {self.max_restarts} after a {kind}: "
                f"epoch {self._epoch} resumes at {where} {how}{why}",
                detail,
            )
        )

    def _after_main_stall(self, failed: Settings) -> tuple[Settings | None, str]:
        """Where loading goes after the guard interrupted a stalled next() in the main process, and why: to one
        worker started with spawn, which the guard can end if it stalls again (it can only interrupt the main
        process, whose state the interrupted code may have left half-changed); the main process again when the
        dataset or its functions cannot be sent to a worker. Once only: that worker is the last rung, so a
        loader never goes back and forth between the two; none when a single spawned worker was tried before
        (the ladder came down through it)."""
        if any(s.num_workers == 1 and s.effective_start_method == "spawn" for s in self.tried):
            return None, ""
        if self._picklable():
            return escalation(failed), (
                ": loading moves out of the main process, which the guard can only interrupt, to one worker "
                "started with spawn, which it can end if it stalls again; the last rung"
            )
        return failed, (
            ": the dataset or its functions cannot be sent to a worker process (see the log), so loading stays "
            "in the main process"
        )

    def _at(self) -> str:
        """The epoch's next batch, as the guard's messages name it: of how many, when a plan says."""
        length = None if self._iterable else self._plan.length
        return f"batch {self._position}" + ("" if length is None else f" of {length}")

    def _too_many_bad(self, position: int) -> LoaderDoctorError:
        bad, seen = len(self.skipped), self._samples_seen
        shown = ", ".join(map(str, self.skipped[:_INDICES_SHOWN]))
        if bad > _INDICES_SHOWN:
            shown += f" and {bad - _INDICES_SHOWN} more (loader.skipped lists them all)"
        last = self.events[-1].detail
        return LoaderDoctorError(
            f"the guarded DataLoader stopped at epoch {self._epoch}, batch {position}: {bad} of the {seen} samples "
            f"seen failed to load: a bad share of at least {bad_share_floor(bad, seen):.1%} (at "
            f"{BAD_SHARE_CONFIDENCE:.1%} confidence), over max_bad_fraction={self.max_bad_fraction:g}. "
            f"Bad indices: {shown}. Last error: "
            f"dataset[{last['index']}] raised {last['error_type']}: {last['message']}",
            hint="each sample-skipped event on loader.events holds its error and traceback: fix or remove those "
            "samples, or allow a larger share with max_bad_fraction",
        )

    def _gave_up(self, kind: str, error: BaseException | None) -> LoaderGaveUp:
        what = "a stall" if kind == "stall" else "a worker died"
        tried = " -> ".join(s.describe() for s in self.tried) or self.settings.describe()
        message = (
            f"the guarded DataLoader gave up at epoch {self._epoch}, {self._at()}: "
            f"{what}, after {plural(self.restarts, 'restart')} (max_restarts={self.max_restarts}). "
            f"Settings tried: {tried}."
        )
        if self.restarts < self.max_restarts:
            if self._escalated:
                message += " Loading had moved out of the main process to one spawned worker already: the last rung."
            elif self._iterable and self.settings.num_workers > 1:
                message += (
                    " No rung is left: an IterableDataset's workers each iterate their own stream, whose states "
                    "resume on as many workers only."
                )
        if kind == "stall":
            message += f" Stuck at: {stuck_text(self._last_stacks)}."
        elif error is not None:
            message += f" Last error: {error}"
        return LoaderGaveUp(
            message,
            hint="the stuck frame is where loading waits (a lock, a read that never returns, a library "
            "deadlocked by fork): fix it there; or allow more restarts (max_restarts)",
        )


def _is_loader_attribute(loader: DataLoader, name: str) -> bool:
    """Whether `name` is one of the DataLoader's own attributes (set in its __init__, or a property)."""
    return name in vars(loader) or isinstance(getattr(type(loader), name, None), property)


class _EpochIterator:
    """One epoch of a GuardedLoader."""

    def __init__(self, guarded: GuardedLoader, epoch: int) -> None:
        self._guarded = guarded
        self.epoch = epoch

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        return self._guarded._next(self.epoch)

    def __len__(self) -> int:
        return len(self._guarded)
