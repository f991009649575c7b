"""A Recording: plain, JSON-ready data of one measured run of a loader, and the figures derived from it."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.settings import Settings


@dataclass
class StrayProcess:
    """A process that looks like a DataLoader worker left behind by an earlier run."""

    pid: int
    cmdline: str
    cpu_percent: float
    age_s: float


@dataclass
class HostFacts:
    """The machine as the loader sees it."""

    cpu_count: int
    usable_cores: float  # affinity mask and cgroup quota taken into account
    affinity_cores: int
    cgroup_cpu_quota: float | None
    shm_free_bytes: int | None
    shm_total_bytes: int | None
    open_fds: int | None
    fd_soft_limit: int | None
    sharing_strategy: str
    local_ranks: int
    accelerator: str | None  # "cuda" when one is usable, else None
    stray_workers: list[StrayProcess] = field(default_factory=list)


@dataclass
class IteratorFacts:
    """What held in the main process when an iterator (and so its workers) was created."""

    epoch: int
    start_method: str | None
    threads: list[str]  # names of the other threads alive in the main process, loaderdoctor's own excluded
    cuda_initialized: bool
    inductor_loaded: bool
    # OS threads Python did not start (OpenMP, BLAS, CUDA pools...): usually harmless to fork, since torch gives
    # each worker one thread, but a worker that enlarges its pool again can hang on the copied pool's state.
    native_threads: int = 0


@dataclass
class EpochRecord:
    epoch: int
    first_batch_s: float | None  # from iter() to the first batch; None when none came
    batches: int
    wall_s: float  # from iter(), as first_batch_s, to the epoch's end
    worker_pids: list[int]
    ended: str  # "exhausted" | "time" | "stall" | "worker-died" | "error"


@dataclass
class BatchRecord:
    epoch: int
    index: int  # the batch's number within its epoch
    wait_s: float  # time blocked in next()
    wait_cpu_s: float  # CPU time the main process used meanwhile (all of loading, without workers)
    step_s: float  # time in the training step that followed
    nbytes: int
    samples: int


@dataclass
class WorkerSample:
    t_s: float  # seconds since the run started
    pid: int
    uss_bytes: int
    rss_bytes: int
    cpu_s: float
    threads: int


@dataclass
class SampleError:
    epoch: int
    batch: int
    index: int | None  # the dataset index, when the dataset is map-style
    error_type: str
    message: str


@dataclass
class StackFrame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass
class WorkerStack:
    pid: int  # the worker's pid; the main process's own pid when loading ran there
    frames: list[StackFrame]  # innermost first
    stuck_frame: StackFrame | None  # the innermost frame in the user's code


@dataclass
class Stall:
    epoch: int
    batch: int  # the batch that never came
    waited_s: float
    threshold_s: float
    reason: str
    stacks: list[WorkerStack] = field(default_factory=list)
    workers_cpu_idle: bool | None = None
    over_budget: bool = False  # declared because the measuring budget ran out, not by the stall policy

    @property
    def hung(self) -> bool:
        """Whether this was a hang, not a slow batch that outlasted the budget while workers still computed."""
        return not self.over_budget or self.workers_cpu_idle is True


@dataclass
class WorkerDeath:
    epoch: int
    batch: int
    message: str


@dataclass
class Recording:
    settings: Settings
    start_method: str | None
    batch_size: int | None
    batches_per_epoch: int | None
    iterable: bool
    step_s: float | None  # the training step per batch, None when there is none
    budget_s: float
    host: HostFacts
    iterators: list[IteratorFacts] = field(default_factory=list)
    epochs: list[EpochRecord] = field(default_factory=list)
    batches: list[BatchRecord] = field(default_factory=list)
    worker_samples: list[WorkerSample] = field(default_factory=list)
    sample_errors: list[SampleError] = field(default_factory=list)
    stall: Stall | None = None
    worker_deaths: list[WorkerDeath] = field(default_factory=list)
    pickled_dataset_bytes: int | None = None
    dataset: str = ""  # the dataset's class name
    dataset_len: int | None = None
    outcome: str = "completed"  # "completed" | "stalled" | "crashed"
    error: str | None = None
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def steady_batches(rec: Recording) -> list[BatchRecord]:
    """Batches after the first delivered in each epoch: the first one's wait is start-up, counted apart."""
    seen: set[int] = set()
    steady = []
    for batch in rec.batches:
        if batch.epoch in seen:
            steady.append(batch)
        seen.add(batch.epoch)
    return steady


def mean_batch_bytes(rec: Recording) -> float | None:
    """The mean size of a delivered batch in bytes; None when none was delivered."""
    return statistics.mean(b.nbytes for b in rec.batches) if rec.batches else None


def wait_fraction(rec: Recording) -> float | None:
    """Share of steady-state time the training loop spent waiting in next(); None without a training step."""
    if rec.step_s is None:
        return None
    steady = steady_batches(rec)
    total = sum(b.wait_s + b.step_s for b in steady)
    return sum(b.wait_s for b in steady) / total if total > 0 else None


def startup_s(rec: Recording) -> float:
    """Seconds spent from each iter() to its epoch's first batch, all epochs together."""
    return sum(e.first_batch_s or 0.0 for e in rec.epochs)


def batches_per_s(rec: Recording) -> float:
    """Delivered batches per second of the whole run, start-up and training steps included."""
    return len(rec.batches) / rec.wall_s if rec.wall_s > 0 else 0.0


def worker_growth(rec: Recording) -> dict[int, tuple[float, float, float]]:
    """Per worker pid: (USS at its first sample, USS at its last, seconds between), in bytes and seconds."""
    by_pid: dict[int, list[WorkerSample]] = {}
    for sample in rec.worker_samples:
        by_pid.setdefault(sample.pid, []).append(sample)
    return {
        pid: (float(s[0].uss_bytes), float(s[-1].uss_bytes), s[-1].t_s - s[0].t_s)
        for pid, s in by_pid.items()
        if len(s) >= 2
    }


def loading_cpu_share(rec: Recording) -> float | None:
    """How busy loading kept its processes: CPU seconds per second of loading, averaged over the workers
    (or the main process while it waited, without workers). Near 1: computing; near 0: waiting on I/O."""
    if rec.settings.num_workers == 0:
        steady = steady_batches(rec)
        waited = sum(b.wait_s for b in steady)
        return sum(b.wait_cpu_s for b in steady) / waited if waited > 0 else None
    by_pid: dict[int, list[WorkerSample]] = {}
    for sample in rec.worker_samples:
        by_pid.setdefault(sample.pid, []).append(sample)
    shares = [
        (s[-1].cpu_s - s[0].cpu_s) / (s[-1].t_s - s[0].t_s)
        for s in by_pid.values()
        if len(s) >= 2 and s[-1].t_s > s[0].t_s
    ]
    return statistics.mean(shares) if shares else None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measurements(rec: Recording) -> dict[str, Any]:
    """The figures a report shows for a recording (the JSON schema's "measurements")."""
    steady_waits = [b.wait_s for b in steady_batches(rec)]
    uss = [s.uss_bytes for s in rec.worker_samples]
    per_batch = batches_per_s(rec)
    samples = sum(b.samples for b in rec.batches)
    wf = wait_fraction(rec)
    batch_bytes = mean_batch_bytes(rec)
    return {
        "batches_per_s": round(per_batch, 3),
        "samples_per_s": round(samples / rec.wall_s, 3) if rec.wall_s > 0 else 0.0,
        "wait_fraction": None if wf is None else round(wf, 4),
        "startup_fraction": round(startup_s(rec) / rec.wall_s, 4) if rec.wall_s > 0 else None,
        "first_batch_s": [None if e.first_batch_s is None else round(e.first_batch_s, 4) for e in rec.epochs],
        "epochs": len(rec.epochs),
        "batches": len(rec.batches),
        "wall_s": round(rec.wall_s, 3),
        "step_ms": None if rec.step_s is None else round(rec.step_s * 1000, 3),
        "wait_ms_p50": _ms(statistics.median(steady_waits) if steady_waits else None),
        "wait_ms_p95": _ms(_percentile(steady_waits, 0.95)),
        "batch_mb": None if batch_bytes is None else round(batch_bytes / 2**20, 3),
        "loading_cpu_share": _rounded(loading_cpu_share(rec), 3),
        "worker_uss_mb_max": round(max(uss) / 2**20, 1) if uss else None,
        "start_method": rec.start_method,
        "outcome": rec.outcome,
        "sample_errors": len(rec.sample_errors),
    }


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
