"""What loading used while it ran steadily: CPU against the cores it could have (not per worker), other
processes' share of the machine, and workers' memory once started."""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from loaderdoctor.recording import Recording, Window, WorkerSample, steady_batches

# The training process keeps at least this much of a core whatever other processes take.
_MIN_AVAILABLE_CORES = 1.0
# The machine is busy while processes outside the run keep this many cores busy.
BUSY_OTHER_CORES = 0.5


@dataclass(frozen=True)
class LoadingCpu:
    """CPU that loading used in steady running, against the cores it could have used."""

    cores: float  # CPU seconds per second that loading used: its workers together (or the main process)
    loaders: int  # the processes or threads loading ran in (1 for the main process)
    usable_cores: float  # of the machine, for this process (affinity mask and cgroup quota)
    main_cores: float | None  # the training process's own CPU besides loading (None: it is the loader)
    other_cores: float | None  # processes outside the run (None: unknown)

    @property
    def available_cores(self) -> float:
        """The usable cores less what the training process itself and other processes took meanwhile (at
        least one core, or the quota if that is less)."""
        taken = (self.main_cores or 0.0) + (self.other_cores or 0.0)
        return max(min(_MIN_AVAILABLE_CORES, self.usable_cores), self.usable_cores - taken)

    @property
    def own_cores(self) -> float:
        """The usable cores less what the training process itself took (at least one core, or the quota if
        that is less): what a fix plans its workers for. Other processes' load comes and goes; it is reported,
        and counts in `share`, but a fix is not cut to it."""
        return max(min(_MIN_AVAILABLE_CORES, self.usable_cores), self.usable_cores - (self.main_cores or 0.0))

    @property
    def capacity(self) -> float:
        """The most CPU loading could use: one core per process or thread, within the cores available."""
        return min(float(self.loaders), self.available_cores)

    @property
    def share(self) -> float:
        """cores / capacity: near 1, loading computes all it can (CPU-bound); near 0, it waits (on I/O)."""
        return self.cores / self.capacity if self.capacity > 0 else 0.0

    @property
    def per_loader(self) -> float:
        """The cores one worker (or the main process, or one thread) kept busy."""
        return self.cores / self.loaders if self.loaders else 0.0

    @property
    def machine_share(self) -> float:
        """How busy the usable cores were in all: loading, the training process and other processes."""
        used = self.cores + (self.main_cores or 0.0) + (self.other_cores or 0.0)
        return used / self.usable_cores if self.usable_cores > 0 else 0.0


def _worker_startups(rec: Recording) -> list[tuple[float, float]]:
    """The start-up of each epoch whose iter() started workers (the first, and every one for workers that do
    not persist), from iter() to its first batch, in seconds since the run started."""
    startups = []
    previous: list[int] | None = None
    for epoch in rec.epochs:
        if epoch.worker_pids != previous:
            end = epoch.first_batch_s if epoch.first_batch_s is not None else 1e12
            startups.append((epoch.started_s, epoch.started_s + end))
        previous = epoch.worker_pids
    return startups


def _ticks(rec: Recording, window: Window | None) -> list[tuple[float, float]]:
    """Consecutive sampling moments (the sampler stamps every process it reads at once) in steady running:
    inside the window (or, without one, any of the run's windows when it has some), and clear of the start-up
    of workers."""
    windows = [window] if window is not None else rec.windows
    startups = _worker_startups(rec)
    times = sorted({s.t_s for s in rec.host_samples} | {s.t_s for s in rec.worker_samples})
    return [
        (a, b)
        for a, b in itertools.pairwise(times)
        if b > a
        and (not windows or any(w.started_s <= a and b <= w.ended_s for w in windows))
        and not any(a < end and b > start for start, end in startups)
    ]


def _worker_cpu_s(rec: Recording, ticks: list[tuple[float, float]]) -> float:
    """CPU seconds the workers used over these ticks, each worker counted where it was sampled at both ends."""
    cpu = {(s.pid, s.t_s): s.cpu_s for s in rec.worker_samples}
    pids = {s.pid for s in rec.worker_samples}
    used = 0.0
    for a, b in ticks:
        for pid in pids:
            if (pid, a) in cpu and (pid, b) in cpu:
                used += max(0.0, cpu[(pid, b)] - cpu[(pid, a)])
    return used


def _host_deltas(rec: Recording, ticks: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(CPU seconds of the whole machine, of the training process) over these ticks; None without samples."""
    host = {s.t_s: s for s in rec.host_samples}
    pairs = [(host[a], host[b]) for a, b in ticks if a in host and b in host]
    if not pairs:
        return None
    return (
        sum(max(0.0, b.busy_cpu_s - a.busy_cpu_s) for a, b in pairs),
        sum(max(0.0, b.main_cpu_s - a.main_cpu_s) for a, b in pairs),
    )


def other_cores(rec: Recording, window: Window | None = None) -> float | None:
    """Cores that processes outside this run (not the training process, not its workers) kept busy during
    steady running; None without samples of the machine."""
    figures = _machine(rec, window)
    return None if figures is None else figures[1]


def _machine(rec: Recording, window: Window | None) -> tuple[float, float, float] | None:
    """(the training process's cores, other processes' cores, workers' cores) over the steady ticks with
    samples of the machine; None without any."""
    sampled = {s.t_s for s in rec.host_samples}
    ticks = [t for t in _ticks(rec, window) if t[0] in sampled and t[1] in sampled]
    deltas = _host_deltas(rec, ticks)
    seconds = sum(b - a for a, b in ticks)
    if deltas is None or seconds <= 0:
        return None
    busy, main = deltas
    workers = _worker_cpu_s(rec, ticks)
    return main / seconds, max(0.0, (busy - main - workers) / seconds), workers / seconds


def loading_cpu(rec: Recording, window: Window | None = None) -> LoadingCpu | None:
    """CPU that loading used in steady running, against the cores it could have used; None when unknown.

    Without workers, loading runs in next(): the training process's CPU while it waited. With worker
    processes: their CPU seconds together over the steady time. With threads: the training process's CPU
    over the steady time (the step itself is a sleep, or runs on an accelerator).
    """
    settings = rec.settings
    usable = rec.host.usable_cores
    machine = _machine(rec, window)
    others = None if machine is None else machine[1]
    if settings.num_workers == 0:
        steady = steady_batches(rec, window)
        waited = sum(b.wait_s for b in steady)
        if waited <= 0:
            return None
        return LoadingCpu(sum(b.wait_cpu_s for b in steady) / waited, 1, usable, None, others)
    if settings.backend == "thread":
        if machine is None:
            return None
        return LoadingCpu(machine[0], settings.num_workers, usable, None, others)
    ticks = _ticks(rec, window)
    seconds = sum(b - a for a, b in ticks)
    if seconds <= 0 or not rec.worker_samples:
        return None
    main = None if machine is None else machine[0]
    return LoadingCpu(_worker_cpu_s(rec, ticks) / seconds, settings.num_workers, usable, main, others)


def worker_cpu_per_batch(rec: Recording) -> float | None:
    """The worker processes' CPU seconds per batch delivered while they ran, over the steady ticks (see _ticks):
    every batch delivered in them counted, an epoch's first ones too, so that the loading done while an epoch
    starts and ends is in the figure. None without samples or batches in those ticks."""
    ticks = _ticks(rec, None)
    if not ticks or not rec.worker_samples:
        return None
    starts = [a for a, _ in ticks]  # consecutive sampling moments: sorted, not overlapping
    delivered = 0
    for batch in rec.batches:
        k = bisect.bisect_left(starts, batch.delivered_s) - 1  # the tick starting before it, if any
        delivered += k >= 0 and batch.delivered_s <= ticks[k][1]
    if delivered == 0:
        return None
    # A long watched run keeps an even thinning of its batches: each kept one stands for that many.
    kept_share = len(rec.batches) / rec.batches_delivered if rec.batches_delivered else 1.0
    return _worker_cpu_s(rec, ticks) * kept_share / delivered


def _started_at(rec: Recording) -> dict[int, float]:
    """When each worker had finished starting: when its first batch came (workers take turns, so worker k's
    is its epoch's batch k), else its epoch's first batch."""
    delivered = {(b.epoch, b.index): b.delivered_s for b in rec.batches}
    done: dict[int, float] = {}
    for epoch in rec.epochs:
        if epoch.first_batch_s is None:
            continue
        first = epoch.started_s + epoch.first_batch_s
        for k, pid in enumerate(epoch.worker_pids):
            done.setdefault(pid, max(first, delivered.get((epoch.epoch, k), first)))
    return done


def worker_samples_after_startup(rec: Recording) -> dict[int, list[WorkerSample]]:
    """Each worker's samples in time order, from its first batch on: a spawned worker's imports at start-up
    are not growth."""
    started = _started_at(rec)
    by_pid: dict[int, list[WorkerSample]] = {}
    for sample in sorted(rec.worker_samples, key=lambda s: s.t_s):
        if sample.pid in started and sample.t_s >= started[sample.pid]:
            by_pid.setdefault(sample.pid, []).append(sample)
    return by_pid


def worker_growth(rec: Recording) -> dict[int, tuple[float, float, float]]:
    """Per worker pid, from its first batch on: (USS at its first sample after start-up, USS at its last,
    seconds between), in bytes and seconds."""
    return {
        pid: (float(s[0].uss_bytes), float(s[-1].uss_bytes), s[-1].t_s - s[0].t_s)
        for pid, s in worker_samples_after_startup(rec).items()
        if len(s) >= 2
    }


def worker_uss_after_startup(rec: Recording) -> list[int]:
    """Every USS sample of a worker taken once it had started (all of them when start-ups are unknown)."""
    started = _started_at(rec)
    if not started:
        return [s.uss_bytes for s in rec.worker_samples]
    return [s.uss_bytes for s in rec.worker_samples if s.t_s >= started.get(s.pid, 0.0)]


def main_step_cpu_s(rec: Recording, window: Window | None = None) -> float | None:
    """The CPU seconds the training process used per steady batch outside next() (in the step, with every
    thread of the process): its CPU over steady running, per batch, less its CPU in next(). None without
    samples of the machine; 0 for a step that sleeps or runs on an accelerator."""
    machine = _machine(rec, window)
    steady = steady_batches(rec, window)
    if machine is None or not steady:
        return None
    interval = sum(b.wait_s + b.step_s for b in steady) / len(steady)
    in_next = sum(b.wait_cpu_s for b in steady) / len(steady)
    return max(0.0, machine[0] * interval - in_next)
