"""The probe: runs a loader with one Settings for a bounded time through the tap, and keeps a Recording."""

from __future__ import annotations

import logging
import math
import pickle
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from loaderdoctor.errors import LoaderDoctorError, UsageError
from loaderdoctor.host import host_facts
from loaderdoctor.indexed import IndexedDataset, parse_sample_failures
from loaderdoctor.interrupt import Interrupted, MainThreadInterrupter
from loaderdoctor.recording import (
    BatchRecord,
    EpochRecord,
    Recording,
    SampleError,
    Stall,
    WorkerDeath,
)
from loaderdoctor.settings import LoaderSpec, Settings, quiet_worker_count_advice
from loaderdoctor.tap import BatchDelivered, Event, IteratorCreated, Tap, TapIterator, is_worker_death
from loaderdoctor.target import describe_exception
from loaderdoctor.watchdog import StallNotice, StallPolicy, Watchdog
from loaderdoctor.workers import (
    StackDumpHook,
    WorkerSampler,
    dump_worker_stacks,
    kill_workers,
    thread_idle,
    thread_stack,
)
from loaderdoctor.workload import Step, sleep_step

log = logging.getLogger("loaderdoctor")

# A loader whose every batch fails is broken, not unlucky: stop measuring it after this many in a row.
_MAX_CONSECUTIVE_FAILURES = 50


@dataclass(frozen=True)
class ProbeProgress:
    epoch: int
    epochs: int
    batches: int
    elapsed_s: float
    budget_s: float


class _CountingSink:
    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes  # protocol 5 hands over large buffers (numpy arrays) as PickleBuffers
        self.size += size
        return size


class _SizePickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # Tensors reach spawned workers through shared memory, not inside the pickle.
        if isinstance(obj, torch.Tensor):
            return object, ()
        return NotImplemented


def pickled_bytes(spec: LoaderSpec, start_method: str) -> int:
    """How many bytes every worker started with `start_method` receives and unpickles: the dataset and the
    functions it is loaded with. Raises a UsageError naming what cannot be pickled."""
    parts = {"dataset": spec.dataset, "collate_fn": spec.collate_fn, "worker_init_fn": spec.worker_init_fn}
    total = 0
    for name, value in parts.items():
        sink = _CountingSink()
        try:
            _SizePickler(sink, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except Exception as error:
            raise UsageError(
                f"the loader's {name} ({type(value).__name__}) cannot be pickled, and the {start_method!r} "
                f"start method must send it to every worker: {type(error).__name__}: {error}",
                hint="define classes and functions at module top level (no lambdas or local functions), "
                "and open files, connections and locks lazily inside the worker instead of in __init__",
            ) from None
        if name == "dataset":
            total += sink.size
    return total


class _Run:
    """The state of one probe run: the loop, and what the tap and watchdog report into the Recording."""

    def __init__(
        self,
        spec: LoaderSpec,
        settings: Settings,
        *,
        budget_s: float,
        epochs: int,
        step: Step | None,
        policy: StallPolicy,
        progress: Callable[[ProbeProgress], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.budget_s = budget_s
        self.epochs = epochs
        self.step = step
        self.policy = policy
        self.progress = progress
        self.clock = clock
        self.consumer = threading.current_thread()
        self.interrupter = MainThreadInterrupter()
        start_method = settings.effective_start_method
        self.rec = Recording(
            settings=settings,
            start_method=start_method,
            batch_size=spec.batch_size,
            batches_per_epoch=_length(spec, settings),
            iterable=spec.is_iterable,
            step_s=None,
            budget_s=budget_s,
            host=host_facts(),
            dataset=type(spec.dataset).__name__,
            dataset_len=_sized_len(spec.dataset),
        )
        if start_method in ("spawn", "forkserver"):
            self.rec.pickled_dataset_bytes = pickled_bytes(spec, start_method)
        self.dump_dir = tempfile.mkdtemp(prefix="loaderdoctor-stacks-")
        try:
            loader = spec.build(
                settings,
                dataset=None if spec.is_iterable else IndexedDataset(spec.dataset),
                worker_hook=StackDumpHook(self.dump_dir) if settings.num_workers else None,
            )
        except Exception:
            shutil.rmtree(self.dump_dir, ignore_errors=True)
            raise
        self.tap = Tap(loader, [self.on_event], start_method=start_method, clock=clock)
        self.sampler = WorkerSampler(self.current_pids, clock=clock)
        self.epoch_pids: list[int] = []
        self.first_batch_s: dict[int, float] = {}
        self.step_times: list[float] = []

    def current_pids(self) -> list[int]:
        current = self.tap.current
        return list(current.pids) if current is not None else []

    def on_event(self, event: Event) -> None:
        if isinstance(event, IteratorCreated):
            if event.facts is not None:
                self.rec.iterators.append(event.facts)
            self.epoch_pids = event.worker_pids
        elif isinstance(event, BatchDelivered):
            if event.first_batch_s is not None:
                self.first_batch_s[event.epoch] = event.first_batch_s
            self.rec.batches.append(
                BatchRecord(
                    epoch=event.epoch,
                    index=event.index,
                    wait_s=event.wait_s,
                    wait_cpu_s=event.wait_cpu_s,
                    step_s=0.0,
                    nbytes=event.nbytes,
                    samples=event.samples,
                )
            )

    def on_stall(self, notice: StallNotice) -> None:
        """From the watchdog's thread: capture where loading is stuck, then end the stuck next()."""
        if notice.pids:
            stacks = dump_worker_stacks(notice.pids, self.dump_dir)
            idle = self.sampler.cpu_idle(notice.pids, self.policy.idle_window_s)
        else:
            stacks, idle = [thread_stack(self.consumer)], thread_idle(self.consumer)
        # Set before the workers are killed: the loop reads it when their death ends the stuck next().
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
        if notice.pids:
            # torch notices at once through its SIGCHLD handler in the main thread, else within its 5 s check.
            kill_workers(notice.pids)
        elif not self.interrupter.interrupt() and not self.interrupter.available:
            log.error("loading is stuck in a thread that cannot be interrupted: see the stack above")

    def run(self) -> Recording:
        started = self.clock()
        watchdog = Watchdog(
            self.tap,
            self.policy,
            self.on_stall,
            workers_idle=self.sampler.cpu_idle,
            deadline=started + self.budget_s * 1.5 + 5.0,
        )
        iterator: TapIterator | None = None
        with self.interrupter, quiet_worker_count_advice():
            self.sampler.start()
            watchdog.start()
            try:
                for epoch in range(self.epochs):
                    remaining = self.budget_s - (self.clock() - started)
                    if remaining <= 0 or self.rec.outcome != "completed":
                        break
                    if iterator is not None and not self.settings.persistent_workers:
                        _close(iterator)
                    epoch_deadline = self.clock() + remaining / (self.epochs - epoch)
                    self.report_progress(epoch, started)  # the display moves on while workers start
                    epoch_started = self.clock()
                    try:
                        iterator = self.tap.epoch(epoch)
                    except RuntimeError as error:  # a worker of the last epoch died as this one began
                        if self.failure(epoch, 0, error) is None:
                            raise
                        break
                    self.run_epoch(iterator, epoch, epoch_deadline, started, epoch_started)
            finally:
                watchdog.stop()
                self.sampler.stop()
                if iterator is not None:
                    _close(iterator)
                shutil.rmtree(self.dump_dir, ignore_errors=True)
        self.rec.wall_s = self.clock() - started
        self.rec.worker_samples = self.sampler.samples
        if self.step is not None and self.step_times:
            self.rec.step_s = statistics.median(self.step_times)
        return self.rec

    def report_progress(self, epoch: int, started: float) -> None:
        if self.progress is not None:
            elapsed = self.clock() - started
            self.progress(ProbeProgress(epoch, self.epochs, len(self.rec.batches), elapsed, self.budget_s))

    def run_epoch(
        self, iterator: TapIterator, epoch: int, deadline: float, started: float, epoch_started: float
    ) -> None:
        """Consume one epoch and record it; its wall time counts from iter() (`epoch_started`), as its first
        batch's time does."""
        try:
            ended = self.consume(iterator, epoch, deadline, started)
        except RuntimeError as error:
            # torch's SIGCHLD handler raises a worker's death wherever the main thread is, not only in next().
            ended = self.failure(epoch, iterator.index - 1, error)
            if ended is None:
                raise
        self.rec.epochs.append(
            EpochRecord(
                epoch=epoch,
                first_batch_s=self.first_batch_s.get(epoch),
                batches=sum(1 for b in self.rec.batches if b.epoch == epoch),
                wall_s=self.clock() - epoch_started,
                worker_pids=list(self.epoch_pids),
                ended=ended,
            )
        )

    def failure(self, epoch: int, batch: int, error: BaseException) -> str | None:
        """How `error` ends the run ("stall", "worker-died") with the outcome recorded; None when it does not
        (a sample that raised)."""
        if self.rec.stall is not None:
            self.rec.outcome = "stalled"
            return "stall"
        if is_worker_death(error):
            self.rec.worker_deaths.append(WorkerDeath(epoch, max(batch, 0), str(error)))
            self.rec.outcome = "crashed"
            return "worker-died"
        return None

    def consume(self, iterator: TapIterator, epoch: int, deadline: float, started: float) -> str:
        """Run the epoch's batches through the step until it ends; how it ended."""
        failures_in_a_row = 0
        while True:
            try:
                self.interrupter.armed = True
                try:
                    batch = next(iterator)
                finally:
                    self.interrupter.armed = False
            except StopIteration:
                return "exhausted"
            except Interrupted:
                self.rec.outcome = "stalled"
                return "stall"
            except Exception as error:
                ended = self.failure(epoch, iterator.index - 1, error)
                if ended is not None:
                    return ended
                self.record_sample_error(epoch, iterator.index - 1, error)
                failures_in_a_row += 1
                if failures_in_a_row >= _MAX_CONSECUTIVE_FAILURES:
                    self.rec.outcome = "crashed"
                    self.rec.error = f"{failures_in_a_row} batches in a row failed; the last: {error}"
                    return "error"
                continue
            failures_in_a_row = 0
            if self.step is not None:
                self.run_step(batch)
            del batch
            self.report_progress(epoch, started)
            if self.clock() >= deadline:
                return "time"

    def run_step(self, batch: Any) -> None:
        step_started = self.clock()
        try:
            self.step(batch)
        except Exception as error:
            if is_worker_death(error):
                raise  # a worker died while the step ran: not the step's fault
            raise LoaderDoctorError(
                f"the training step raised {describe_exception(error)}",
                hint="the step given with Workload(step=...) must accept one batch as the loader yields it",
            ) from error
        self.rec.batches[-1].step_s = self.clock() - step_started
        self.step_times.append(self.rec.batches[-1].step_s)

    def record_sample_error(self, epoch: int, batch: int, error: BaseException) -> None:
        for index, error_type, message in parse_sample_failures(error):
            self.rec.sample_errors.append(SampleError(epoch, batch, index, error_type, message))


def _close(iterator: TapIterator) -> None:
    """End an iterator's workers; a death torch reports meanwhile is already recorded, or was expected."""
    try:
        iterator.close()
    except RuntimeError as error:
        if not is_worker_death(error):
            raise


def _sized_len(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


def _length(spec: LoaderSpec, settings: Settings) -> int | None:
    try:
        return len(spec.build(settings.replace(num_workers=0)))
    except TypeError:
        return None


def probe(
    spec: LoaderSpec,
    settings: Settings | None = None,
    *,
    budget_s: float = 30.0,
    epochs: int = 3,
    step: Step | None = None,
    step_ms: float | None = None,
    policy: StallPolicy | None = None,
    progress: Callable[[ProbeProgress], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Recording:
    """Run the loader of `spec` with `settings` (its own by default) for at most `epochs` epochs and about
    `budget_s` seconds, calling the training step after each batch, and return what was measured."""
    if epochs < 1:
        raise UsageError(f"epochs must be 1 or more, not {epochs}")
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise UsageError(f"the budget must be more than 0 seconds, not {budget_s}")
    if step is None and step_ms is not None:
        step = sleep_step(step_ms)
    run = _Run(
        spec,
        settings or spec.settings,
        budget_s=budget_s,
        epochs=epochs,
        step=step,
        policy=policy or StallPolicy(),
        progress=progress,
        clock=clock,
    )
    return run.run()
