"""Which of the workers' threads burn CPU: each thread's CPU over steady running, from the poller's readings, and
the threads of the typical worker that kept a share of a core busy. A pool that sleeps (a library's I/O or
bookkeeping threads, a thread pool per core that has nothing to do) costs the cores nothing."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from loaderdoctor.recording.record import Recording, WorkerReading
from loaderdoctor.recording.usage import _ticks

# A worker's threads besides its main one compute when together they kept at least this share of a core busy over
# steady running; below it they mostly sleep (litdata's and streaming's I/O and bookkeeping threads; check's site
# profiler wakes 100 times a second in each worker and uses 1-2% of a core).
BUSY_THREAD_CORES = 0.1
# Of a pool that computes, a thread counts as one of its computing threads from this share of the busiest one's CPU
# on: 16 OpenMP threads on 2 cores get a sixteenth of a core each, all of them computing.
SHARE_OF_THE_BUSIEST = 0.3


@dataclass(frozen=True)
class WorkerThreads:
    """One worker's threads over steady running: the cores each kept busy, by thread id."""

    pid: int
    cores: dict[str, float]

    @property
    def busy(self) -> int:
        """The threads that computed: the worker's own, and, where its other threads together kept
        BUSY_THREAD_CORES busy, those of them that took SHARE_OF_THE_BUSIEST of the busiest one's CPU or more
        (however thin the cores spread them)."""
        others = [c for tid, c in self.cores.items() if tid != str(self.pid)]
        if sum(others) < BUSY_THREAD_CORES:
            return 1
        busiest = max(others)
        return 1 + sum(c >= SHARE_OF_THE_BUSIEST * busiest for c in others)

    @property
    def beside_main(self) -> float:
        """The cores its threads other than its main one kept busy: what a pool of its own took."""
        return sum(c for tid, c in self.cores.items() if tid != str(self.pid))


def worker_threads(rec: Recording) -> list[WorkerThreads]:
    """Each worker's threads, where the poller read them: over the steady ticks (see usage._ticks), else, for a
    measurement too short to have any, from each worker's first reading to its last."""
    by_pid: dict[int, dict[float, WorkerReading]] = {}
    for sample in rec.worker_samples:
        if sample.thread_cpu_s is not None:
            by_pid.setdefault(sample.pid, {})[sample.t_s] = sample
    ticks = _ticks(rec, None)
    found = []
    for pid, readings in sorted(by_pid.items()):
        spans = [(readings[a], readings[b]) for a, b in ticks if a in readings and b in readings]
        if not spans and len(readings) >= 2:
            times = sorted(readings)
            spans = [(readings[times[0]], readings[times[-1]])]
        cores = _cores_by_thread(spans)
        if cores:
            found.append(WorkerThreads(pid, cores))
    return found


def _cores_by_thread(spans: list[tuple[WorkerReading, WorkerReading]]) -> dict[str, float]:
    """Each thread's CPU seconds per second over the spans in which it was read at both ends."""
    cpu: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for first, last in spans:
        for tid, used in _rises(first, last):
            cpu[tid] = cpu.get(tid, 0.0) + used
            seconds[tid] = seconds.get(tid, 0.0) + (last.t_s - first.t_s)
    return {tid: cpu[tid] / s for tid, s in seconds.items() if s > 0}


def _rises(first: WorkerReading, last: WorkerReading) -> Iterator[tuple[str, float]]:
    before, after = first.thread_cpu_s or {}, last.thread_cpu_s or {}
    for tid, used in after.items():
        if tid in before:
            yield tid, max(0.0, used - before[tid])


def busy_threads_per_worker(rec: Recording) -> int | None:
    """The threads of the typical worker that computed (the median over workers); None where the workers'
    threads were not read (a thread loader, no workers, a report saved before they were)."""
    found = worker_threads(rec)
    return statistics.median_low([w.busy for w in found]) if found else None


def pool_cores_per_worker(rec: Recording) -> float | None:
    """The cores the typical worker's threads besides its main one kept busy (median over workers); None where
    they were not read."""
    found = worker_threads(rec)
    return statistics.median([w.beside_main for w in found]) if found else None
