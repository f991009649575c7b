"""What loading used while it ran steadily: CPU against the cores it could have (not per worker), time it was
ready to run but descheduled, other processes' share of the machine, and workers' memory once started."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from loaderdoctor.recording.record import Recording, Window, WorkerReading, steady_batches

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
    # Seconds per second loading's processes were runnable but not running: descheduled while ready, by other
    # processes or by each other (None: the kernel does not count it, or a report saved before it was read).
    run_delay_cores: float | None = None
    ranks: int = 1  # the job's processes on this machine, which share its usable cores

    @property
    def rank_cores(self) -> float:
        """This process's part of the usable cores: the node's ranks share them."""
        return self.usable_cores / max(1, self.ranks)

    @property
    def available_cores(self) -> float:
        """This rank's part of the usable cores, or what the training process itself and other processes
        (the other ranks among them) left of the usable cores meanwhile where that is less (at least one
        core, or this rank's part if that is less)."""
        taken = (self.main_cores or 0.0) + (self.other_cores or 0.0)
        mine = self.rank_cores
        return max(min(_MIN_AVAILABLE_CORES, mine), min(mine, self.usable_cores - taken))

    @property
    def own_cores(self) -> float:
        """This rank's part of the usable cores less what the training process itself took (at least one core,
        or its part if that is less): what a fix plans its workers for. Other processes' load comes and goes;
        it is reported, and counts in `share`, but a fix is not cut to it."""
        mine = self.rank_cores
        return max(min(_MIN_AVAILABLE_CORES, mine), mine - (self.main_cores or 0.0))

    @property
    def capacity(self) -> float:
        """The most CPU loading could use: one core per process or thread, within the cores available."""
        return min(float(self.loaders), self.available_cores)

    @property
    def share(self) -> float:
        """cores / capacity: the CPU loading used of what it could use, at most 1 (a loader whose ops run on
        several threads, as a main-process loader's torch ops do, uses more than a core: all it could)."""
        return min(1.0, self.cores / self.capacity) if self.capacity > 0 else 0.0

    @property
    def run_delay_share(self) -> float | None:
        """The share of its loaders' time loading was ready to run but descheduled, at most all of it (None: not
        counted). A process's count sums its threads', which can pass its wall time: a share cannot."""
        if self.run_delay_cores is None or not self.loaders:
            return None
        return min(1.0, self.run_delay_cores / self.loaders)

    @property
    def compute_share(self) -> float:
        """How much loading computes rather than waits, the figure its fix follows: near 1 it computes
        (CPU-bound), near 0 its loaders sleep, waiting (on I/O). The larger of `share` and the share of its
        loaders' time they were running or ready to run (at most 1): time descheduled by other processes is
        neither computing nor waiting, and a loader kept off the cores while ready is CPU-bound. Without the
        run delay, `share` alone."""
        if self.run_delay_share is None:
            return self.share
        return max(self.share, min(1.0, self.cores / self.loaders + self.run_delay_share))

    @property
    def per_loader(self) -> float:
        """The cores one worker (or the main process, or one thread) kept busy."""
        return self.cores / self.loaders if self.loaders else 0.0

    @property
    def machine_share(self) -> float:
        """How busy the usable cores were in all: loading, the training process and other processes."""
        used = self.cores + (self.main_cores or 0.0) + (self.other_cores or 0.0)
        return used / self.usable_cores if self.usable_cores > 0 else 0.0


def _epoch_starts(rec: Recording, *, every_epoch: bool) -> list[tuple[float, float]]:
    """The start of each epoch whose iter() started workers (the first, and every one for workers that do not
    persist), or of every epoch, from iter() to its first batch, in seconds since the run started."""
    startups = []
    previous: list[int] | None = None
    for epoch in rec.epochs:
        if every_epoch or epoch.worker_pids != previous:
            end = epoch.first_batch_s if epoch.first_batch_s is not None else 1e12
            startups.append((epoch.started_s, epoch.started_s + end))
        previous = epoch.worker_pids
    return startups


def _ticks(rec: Recording, window: Window | None, *, every_epoch_start: bool = True) -> list[tuple[float, float]]:
    """Consecutive sampling moments (the sampler stamps every process it reads at once) in steady running:
    inside the window (or, without one, any of the run's windows when it has some), and clear of each epoch's
    start, as steady batches are: workers starting, or persistent ones taking in turn what the last epoch left
    in flight, idle meanwhile (which says nothing of loading). With every_epoch_start False, or where no tick
    is clear of every epoch's start (a run of short epochs), clear of workers' start-ups only."""
    windows = [window] if window is not None else rec.windows
    times = sorted({s.t_s for s in rec.host_samples} | {s.t_s for s in rec.worker_samples})
    inside = [
        (a, b)
        for a, b in itertools.pairwise(times)
        if b > a and (not windows or any(w.started_s <= a and b <= w.ended_s for w in windows))
    ]
    clear = _clear_of(inside, _epoch_starts(rec, every_epoch=False))
    steady = _clear_of(clear, _epoch_starts(rec, every_epoch=True)) if every_epoch_start else []
    return steady or clear


def _clear_of(ticks: list[tuple[float, float]], spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The ticks that overlap none of the spans."""
    return [(a, b) for a, b in ticks if not any(a < end and b > start for start, end in spans)]


def _worker_rise(
    rec: Recording, ticks: list[tuple[float, float]], count: Callable[[WorkerReading], float | None]
) -> float | None:
    """How much a count each worker keeps (CPU seconds, run delay) rose over these ticks, the workers together,
    each worker counted where the count was read at both ends (a rise at least 0: a thread that ends takes its
    part of a count along); None where it was read at no tick's two ends."""
    read = {(s.pid, s.t_s): value for s in rec.worker_samples if (value := count(s)) is not None}
    pids = {pid for pid, _ in read}
    rise, pairs = 0.0, 0
    for a, b in ticks:
        for pid in pids:
            if (pid, a) in read and (pid, b) in read:
                rise += max(0.0, read[(pid, b)] - read[(pid, a)])
                pairs += 1
    return rise if pairs else None


def _worker_cpu_s(rec: Recording, ticks: list[tuple[float, float]]) -> float:
    """CPU seconds the workers used over these ticks, each worker counted where it was sampled at both ends."""
    return _worker_rise(rec, ticks, lambda s: s.cpu_s) or 0.0


def _worker_run_delay_s(rec: Recording, ticks: list[tuple[float, float]]) -> float | None:
    """Seconds the workers were ready to run but descheduled over these ticks; None where their run delay was
    not read."""
    return _worker_rise(rec, ticks, lambda s: s.run_delay_s)


def _main_run_delay_cores(rec: Recording, window: Window | None) -> tuple[float, float] | None:
    """(the training process's run delay, its CPU), in seconds per second of the steady ticks with both read;
    None where its run delay was read nowhere."""
    host = {s.t_s: s for s in rec.host_samples if s.main_run_delay_s is not None}
    ticks = [(host[a], host[b]) for a, b in _ticks(rec, window) if a in host and b in host]
    seconds = sum(b.t_s - a.t_s for a, b in ticks)
    if seconds <= 0:
        return None
    delay = sum(max(0.0, (b.main_run_delay_s or 0.0) - (a.main_run_delay_s or 0.0)) for a, b in ticks)
    cpu = sum(max(0.0, b.main_cpu_s - a.main_cpu_s) for a, b in ticks)
    return delay / seconds, cpu / seconds


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

    Without workers, loading runs in next(): the training process's CPU while it waited, and the loop's run
    delay there as the tap read it or the process's run delay per CPU second, for the CPU it used in next(),
    whichever is more (a library's threads load too; events made from a trainer's hooks have only the latter).
    With worker processes: their CPU seconds and run delay together over the steady time. With threads: the
    training process's CPU and run delay over the steady time (the step itself is a sleep, or runs on an
    accelerator). The node's cores are shared by its local ranks.
    """
    settings = rec.settings
    usable, ranks = rec.host.usable_cores, rec.host.local_ranks
    machine = _machine(rec, window)
    others = None if machine is None else machine[1]
    main_delay = _main_run_delay_cores(rec, window)
    if settings.num_workers == 0:
        steady = steady_batches(rec, window)
        waited = sum(b.wait_s for b in steady)
        if waited <= 0:
            return None
        cores = sum(b.wait_cpu_s for b in steady) / waited
        delay = None
        measured = [b.wait_run_delay_s for b in steady if b.wait_run_delay_s is not None]
        if len(measured) == len(steady):  # the tap read the loop's own run delay in each next()
            delay = sum(measured) / waited
        if main_delay is not None:
            # The process's threads, all of them, by its CPU in next(): events made from a trainer's hooks have
            # no other; and a decoder's own threads (PyAV's, OpenCV's) load too, descheduled while the loop's
            # thread sleeps on them, so that its own run delay alone says a starved decoder waits.
            delay_cores, main_cpu_cores = main_delay
            by_process = delay_cores / main_cpu_cores * cores if main_cpu_cores > 0 else 0.0
            delay = by_process if delay is None else max(delay, by_process)
        return LoadingCpu(cores, 1, usable, None, others, delay, ranks)
    if settings.backend == "thread":
        if machine is None:
            return None
        delay = None if main_delay is None else main_delay[0]
        return LoadingCpu(machine[0], settings.num_workers, usable, None, others, delay, ranks)
    ticks = _ticks(rec, window)
    seconds = sum(b - a for a, b in ticks)
    if seconds <= 0 or not rec.worker_samples:
        return None
    main = None if machine is None else machine[0]
    delay_s = _worker_run_delay_s(rec, ticks)
    delay = None if delay_s is None else delay_s / seconds
    return LoadingCpu(_worker_cpu_s(rec, ticks) / seconds, settings.num_workers, usable, main, others, delay, ranks)


def worker_cpu_per_batch(rec: Recording) -> float | None:
    """The worker processes' CPU seconds per batch delivered while they ran, over the steady ticks (see _ticks):
    every batch delivered in them counted, an epoch's first ones too, so that the loading done while an epoch
    starts and ends is in the figure. None without samples or batches in those ticks."""
    ticks = _ticks(rec, None, every_epoch_start=False)
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


def worker_samples_after_startup(rec: Recording) -> dict[int, list[WorkerReading]]:
    """Each worker's samples that read its private memory, in time order, from its first batch on: a spawned
    worker's imports at start-up are not growth."""
    started = _started_at(rec)
    by_pid: dict[int, list[WorkerReading]] = {}
    for sample in sorted(rec.worker_samples, key=lambda s: s.t_s):
        if sample.uss_bytes is not None and sample.pid in started and sample.t_s >= started[sample.pid]:
            by_pid.setdefault(sample.pid, []).append(sample)
    return by_pid


def worker_growth(rec: Recording) -> dict[int, tuple[float, float, float]]:
    """Per worker pid, from its first batch on: (USS at its first sample after start-up, USS at its last,
    seconds between), in bytes and seconds."""
    return {
        pid: (float(s[0].uss_bytes), float(s[-1].uss_bytes), s[-1].t_s - s[0].t_s)  # samples that read it
        for pid, s in worker_samples_after_startup(rec).items()
        if len(s) >= 2
    }


def worker_uss_after_startup(rec: Recording) -> list[int]:
    """Every USS sample of a worker taken once it had started (all of them when start-ups are unknown)."""
    started = _started_at(rec)
    return [
        s.uss_bytes
        for s in rec.worker_samples
        if s.uss_bytes is not None and (not started or s.t_s >= started.get(s.pid, 0.0))
    ]


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
