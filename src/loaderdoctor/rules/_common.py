"""Figures and wording that several rules share, so that each is defined once."""

from __future__ import annotations

import statistics
from typing import Any

from loaderdoctor.plain.numbers import MIB
from loaderdoctor.recording.record import (
    Recording,
    WorkerReading,
    steady_batches,  # one definition of steady state
)

# How much loading computes rather than waits (usage.LoadingCpu.compute_share): from this share on, loading
# computes all it can and more workers than cores only compete; below WAITING_SHARE its processes mostly wait
# (on disk, network), and more of them than cores keep more reads in flight.
COMPUTING_SHARE = 0.75
WAITING_SHARE = 0.5

# A plain DataLoader worker runs 1-3 threads; a thread pool per core (OpenCV, BLAS, OpenMP) shows as more.
POOLED_THREADS_PER_WORKER = 4

# What PyTorch uses when prefetch_factor is left unset and there are workers.
DEFAULT_PREFETCH_FACTOR = 2


def mb(nbytes: float) -> float:
    """Bytes as MiB, rounded for evidence and titles."""
    return round(nbytes / MIB, 1)


def settings_snippet(rec: Recording, change: dict[str, Any]) -> str | None:
    """Paste-ready DataLoader code for the recorded settings with `change` applied; None without a change."""
    return rec.settings.replace(**change).snippet(rec.loader_class) if change else None


def steady_interval_s(rec: Recording) -> float:
    """The typical time from one batch to the next once running: median of wait plus step."""
    intervals = [b.wait_s + b.step_s for b in steady_batches(rec)]
    return statistics.median(intervals) if intervals else 0.0


def samples_by_worker(rec: Recording) -> dict[int, list[WorkerReading]]:
    """Each worker pid's samples, in time order."""
    by_pid: dict[int, list[WorkerReading]] = {}
    for sample in sorted(rec.worker_samples, key=lambda s: s.t_s):
        by_pid.setdefault(sample.pid, []).append(sample)
    return by_pid


def threads_per_worker(rec: Recording) -> int | None:
    """Threads of the typical worker: each worker's most, then the median over workers."""
    most = [max(s.threads for s in samples) for samples in samples_by_worker(rec).values()]
    return statistics.median_low(most) if most else None


def workers_run_pools(rec: Recording) -> bool:
    """Whether the workers run thread pools of their own (more threads than a plain worker has)."""
    threads = threads_per_worker(rec)
    return threads is not None and threads >= POOLED_THREADS_PER_WORKER
