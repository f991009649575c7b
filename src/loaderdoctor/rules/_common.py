"""Figures and wording that several rules share, so that each is defined once."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from loaderdoctor.recording import (
    Recording,
    WorkerSample,
    steady_batches,  # one definition of steady state
)

MIB = 2**20

# TensorFlow's input-pipeline analyzer draws the same lines: under 5% of the time is not worth a warning,
# over 20% is the main cost of the run.
CRITICAL_TIME_SHARE = 0.20
WARNING_TIME_SHARE = 0.05

# Below this many CPU seconds per second of loading, the loading processes mostly wait (on disk, network):
# more of them than cores keeps more reads in flight instead of competing for the cores.
IO_BOUND_CPU_SHARE = 0.5

# A plain DataLoader worker runs 1-3 threads; a thread pool per core (OpenCV, BLAS, OpenMP) shows as more.
POOLED_THREADS_PER_WORKER = 4

# What PyTorch uses when prefetch_factor is left unset and there are workers.
DEFAULT_PREFETCH_FACTOR = 2


def mb(nbytes: float) -> float:
    """Bytes as MiB, rounded for evidence and titles."""
    return round(nbytes / MIB, 1)


def percent(fraction: float) -> str:
    """A fraction in the words a title uses: '62%', or '0.4%' when it is small."""
    if fraction >= 0.01:
        return f"{fraction * 100:.0f}%"
    return f"{fraction * 100:.1f}%"


def time_cost_severity(fraction: float) -> str | None:
    """The severity of a measured share of the run's time, None when it is too small to mention."""
    if fraction > CRITICAL_TIME_SHARE:
        return "critical"
    if fraction >= WARNING_TIME_SHARE:
        return "warning"
    return None


def rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def settings_snippet(rec: Recording, change: dict[str, Any]) -> str | None:
    """Paste-ready DataLoader code for the recorded settings with `change` applied; None without a change."""
    return rec.settings.replace(**change).snippet() if change else None


def is_io_bound(loading_cpu_share: float | None) -> bool:
    """True when measurement shows loading waits more than it computes."""
    return loading_cpu_share is not None and loading_cpu_share < IO_BOUND_CPU_SHARE


def steady_interval_s(rec: Recording) -> float:
    """The typical time from one batch to the next once running: median of wait plus step."""
    intervals = [b.wait_s + b.step_s for b in steady_batches(rec)]
    return statistics.median(intervals) if intervals else 0.0


def samples_by_worker(rec: Recording) -> dict[int, list[WorkerSample]]:
    """Each worker pid's samples, in time order."""
    by_pid: dict[int, list[WorkerSample]] = {}
    for sample in sorted(rec.worker_samples, key=lambda s: s.t_s):
        by_pid.setdefault(sample.pid, []).append(sample)
    return by_pid


def threads_per_worker(rec: Recording) -> int | None:
    """Threads of the typical worker: each worker's most, then the median over workers."""
    most = [max(s.threads for s in samples) for samples in samples_by_worker(rec).values()]
    return statistics.median_low(most) if most else None


@dataclass(frozen=True)
class ForkHazards:
    """What was alive in the main process when workers were created that a forked child cannot inherit."""

    threads: list[str]
    cuda_initialized: bool
    inductor_loaded: bool
    native_threads: int = 0

    def __bool__(self) -> bool:
        """Whether there is a hazard worth a warning before anything failed (native thread pools are not:
        almost every torch process has them, and they hang a worker only in combination)."""
        return bool(self.threads) or self.cuda_initialized or self.inductor_loaded

    def explain(self, failed: bool, pools_in_workers: bool) -> bool:
        """Whether these hazards explain a failure. Native thread pools copied by fork do when the workers
        start thread pools again (the OpenMP/BLAS fork hang); on their own they are in every torch process."""
        return bool(self) or (failed and pools_in_workers and self.native_threads > 0)

    def describe(self) -> str:
        """The hazards in words, e.g. '2 other threads ran (pin_memory, t1) and CUDA was initialised'."""
        parts = []
        if self.threads:
            shown = ", ".join(self.threads[:5]) + (", ..." if len(self.threads) > 5 else "")
            noun = "thread" if len(self.threads) == 1 else "threads"
            parts.append(f"{len(self.threads)} other {noun} ran ({shown})")
        if self.cuda_initialized:
            parts.append("CUDA was initialised")
        if self.inductor_loaded:
            parts.append("torch.compile (inductor) was loaded")
        if self.native_threads:
            noun = "thread" if self.native_threads == 1 else "threads"
            parts.append(f"{self.native_threads} native {noun} ran (OpenMP/BLAS pools and the like)")
        return " and ".join(parts)


def workers_run_pools(rec: Recording) -> bool:
    """Whether the workers run thread pools of their own (more threads than a plain worker has)."""
    threads = threads_per_worker(rec)
    return threads is not None and threads >= POOLED_THREADS_PER_WORKER


def fork_hazards(rec: Recording) -> ForkHazards:
    """The fork hazards seen at any iterator's creation in the recording."""
    threads = sorted({name for it in rec.iterators for name in it.threads})
    return ForkHazards(
        threads=threads,
        cuda_initialized=any(it.cuda_initialized for it in rec.iterators),
        inductor_loaded=any(it.inductor_loaded for it in rec.iterators),
        native_threads=max((it.native_threads for it in rec.iterators), default=0),
    )
