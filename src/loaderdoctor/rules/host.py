"""Rules about the machine's limits that a loader runs into: cores, open files, /dev/shm, leftover processes."""

from __future__ import annotations

import math
from typing import Any

from loaderdoctor.host.facts import program_name
from loaderdoctor.plain.numbers import rounded
from loaderdoctor.plain.words import percent, plural
from loaderdoctor.recording.record import Recording, mean_batch_bytes, wait_fraction
from loaderdoctor.recording.threads import busy_threads_per_worker, pool_cores_per_worker
from loaderdoctor.recording.usage import LoadingCpu, loading_cpu
from loaderdoctor.rules._common import (
    DEFAULT_PREFETCH_FACTOR,
    POOLED_THREADS_PER_WORKER,
    mb,
    settings_snippet,
    threads_per_worker,
)
from loaderdoctor.rules.finding import CRITICAL_TIME_SHARE, Finding

# Thread pools this many times the cores compete whatever else is measured.
MAX_THREADS_PER_CORE = 4
# The usable cores count as saturated when loading, the training process and other processes together keep
# this share of them busy: then workers (or their threads) beyond the cores only take turns on them.
SATURATED_SHARE = 0.85

FD_WARNING_SHARE = 0.8
# Tensors per batch (e.g. inputs and labels) each hold a descriptor under the file_descriptor strategy;
# a Recording does not count them, so this is a guess.
TENSORS_PER_BATCH_GUESS = 2

SHM_WARNING_SHARE = 0.5

STRAY_CRITICAL_CPU_PERCENT = 50.0
CMDLINE_CHARS = 80  # the most of a process's name the run-to-run rules show

RAISE_FD_LIMIT_SNIPPET = """\
import resource

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
# or share tensors through files instead of descriptors:
# torch.multiprocessing.set_sharing_strategy("file_system")"""


def _core_limits(rec: Recording) -> str:
    """Why this process has fewer cores than the machine, in words; empty when it has them all."""
    host = rec.host
    reasons = []
    if host.affinity_cores < host.cpu_count:
        reasons.append(f"its CPU affinity allows {host.affinity_cores} of {host.cpu_count} CPUs")
    if host.cgroup_cpu_quota is not None and host.cgroup_cpu_quota < host.cpu_count:
        reasons.append(f"its container's CPU quota is {host.cgroup_cpu_quota:g} cores")
    return f" (the process has fewer cores than the machine: {' and '.join(reasons)})" if reasons else ""


def cpu_oversubscription(rec: Recording) -> Finding | None:
    """More loading threads or workers than the usable cores can run while the cores are saturated, so they
    slow each other down and cost memory for nothing."""
    workers = rec.settings.num_workers
    if workers == 0 or rec.settings.backend != "process":
        return None
    cores = rec.host.usable_cores
    threads = threads_per_worker(rec)
    # Where each thread's CPU was read, a worker's threads count as they computed: a library's idle I/O and
    # bookkeeping threads, or a pool per core with nothing to do, take no core from anyone. In a report saved
    # before, every thread a worker had counts, as it was judged then.
    busy_threads = busy_threads_per_worker(rec)
    computing = threads if busy_threads is None else busy_threads
    pooled = computing is not None and computing >= (POOLED_THREADS_PER_WORKER if busy_threads is None else 2)
    ranks = rec.host.local_ranks  # every rank of a DDP job on this machine starts as many workers
    compute_threads = workers * (computing if pooled and computing is not None else 1) * ranks
    cpu = loading_cpu(rec)
    saturated = cpu is not None and _loading_fills_the_cores(cpu)
    # Without each thread's CPU, pools far beyond the cores compete even where the measurement could not tell how
    # busy the cores were; with it, threads compete only while they compute and the cores are saturated.
    huge_pools = busy_threads is None and pooled and compute_threads > MAX_THREADS_PER_CORE * cores
    if compute_threads <= cores or not (saturated or huge_pools):
        return None
    fraction = wait_fraction(rec)
    change: dict[str, Any] = {}
    advice = []
    if pooled:
        change["worker_threads"] = 1
        advice.append(
            "limit each worker's thread pools to one thread in worker_init_fn (torch.set_num_threads(1), and "
            "cv2.setNumThreads(1) where OpenCV is loaded): libraries start a pool per core in every worker"
        )
    if workers * ranks > cores:
        change["num_workers"] = max(1, int(cores / ranks))
        per_core = "one per usable core" if ranks == 1 else f"per rank: the {ranks} ranks here share the cores"
        advice.append(
            f"use {plural(change['num_workers'], 'worker')}, {per_core}: CPU-bound workers beyond the "
            "cores only take turns on them"
        )
    of_ranks = f"{ranks} ranks × " if ranks > 1 else ""
    busy_word = "" if busy_threads is None else " busy"
    title = (
        f"{of_ranks}{plural(workers, 'worker')} × {computing}{busy_word} threads compete for {cores:g} usable cores"
        if pooled
        else f"{of_ranks}{plural(workers, 'worker')} compete for {cores:g} usable cores"
    )
    pool_cores = pool_cores_per_worker(rec)
    busy = "" if cpu is None else f", which were {percent(min(cpu.machine_share, 1.0))} busy"
    return Finding(
        rule="cpu-oversubscription",
        severity="critical" if fraction is not None and fraction > CRITICAL_TIME_SHARE else "warning",
        title=title,
        evidence={
            "num_workers": workers,
            "threads_per_worker": threads,
            **({} if busy_threads is None else {"busy_threads_per_worker": busy_threads}),
            **({} if pool_cores is None else {"pool_cores_per_worker": round(pool_cores, 2)}),
            "local_ranks": ranks,
            "usable_cores": cores,
            "affinity_cores": rec.host.affinity_cores,
            "cgroup_cpu_quota": rec.host.cgroup_cpu_quota,
            "cores_busy_share": None if cpu is None else round(cpu.machine_share, 3),
            "loading_cores": None if cpu is None else round(cpu.cores, 2),
            "wait_fraction": rounded(fraction, 3),
        },
        fix=f"Loading runs more threads than the cores can serve{_core_limits(rec)}{busy}: " + "; ".join(advice) + ".",
        snippet=settings_snippet(rec, change),
        settings_change=change,
        impact=fraction or 0.0,
    )


def _loading_fills_the_cores(cpu: LoadingCpu) -> bool:
    """Whether loading itself asks for its cores (SATURATED_SHARE or more of this rank's part of the usable cores):
    the CPU its workers used and the time they were ready to run but waited for a core (run delay). Cores that
    other processes keep busy
    do not count: workers that wait on a lock or on storage do not compete with each other for them, and fewer
    workers would not give the cores back. Where the run delay is not counted, how busy the cores were in all."""
    if cpu.run_delay_cores is None:
        return cpu.machine_share >= SATURATED_SHARE
    return cpu.cores + cpu.run_delay_cores >= SATURATED_SHARE * cpu.rank_cores


def fd_limit(rec: Recording) -> Finding | None:
    """Batches shared through file descriptors would exceed the open-file limit: 'Too many open files'."""
    host = rec.host
    if (
        host.sharing_strategy != "file_descriptor"
        or rec.settings.num_workers == 0
        or host.open_fds is None
        or host.fd_soft_limit is None
    ):
        return None
    in_flight = rec.settings.batches_in_flight * TENSORS_PER_BATCH_GUESS
    needed = host.open_fds + in_flight
    if needed > host.fd_soft_limit:
        severity, title = (
            "critical",
            f"The loader needs about {needed} open files, over the limit of {host.fd_soft_limit}",
        )
    elif needed > FD_WARNING_SHARE * host.fd_soft_limit:
        severity, title = (
            "warning",
            f"Open files would reach about {needed} of the {host.fd_soft_limit} allowed",
        )
    else:
        return None
    return Finding(
        rule="fd-limit",
        severity=severity,
        title=title,
        evidence={
            "open_fds": host.open_fds,
            "fds_in_flight_estimate": in_flight,
            "fd_soft_limit": host.fd_soft_limit,
            "sharing_strategy": host.sharing_strategy,
            "num_workers": rec.settings.num_workers,
            "prefetch_factor": rec.settings.prefetch_factor or DEFAULT_PREFETCH_FACTOR,
        },
        fix=(
            "Every tensor a worker hands over holds an open file descriptor until it is freed. Raise the soft "
            "limit (ulimit -n, or resource.setrlimit at the start of the script), or share through files with "
            'torch.multiprocessing.set_sharing_strategy("file_system").'
        ),
        snippet=RAISE_FD_LIMIT_SNIPPET,
        settings_change={},
        impact=1.0 if severity == "critical" else 0.0,
    )


def _shm_fitting_change(rec: Recording, batch_bytes: float, free_bytes: int) -> dict[str, Any]:
    """The smallest cut (prefetch 1, then fewer workers) that keeps batches in flight under the warning line."""
    settings = rec.settings
    per_worker = batch_bytes * rec.host.local_ranks  # with prefetch_factor=1
    workers = min(settings.num_workers, math.floor(SHM_WARNING_SHARE * free_bytes / per_worker))
    if workers < 1:
        return {}
    change: dict[str, Any] = {}
    if (settings.prefetch_factor or DEFAULT_PREFETCH_FACTOR) > 1:
        change["prefetch_factor"] = 1
    if workers < settings.num_workers:
        change["num_workers"] = workers
    return change


def shm_capacity(rec: Recording) -> Finding | None:
    """Batches in flight would fill /dev/shm, where workers die with 'Bus error'."""
    free = rec.host.shm_free_bytes
    batch_bytes = mean_batch_bytes(rec)
    if rec.settings.num_workers == 0 or free is None or batch_bytes is None:
        return None
    # Every local rank runs its own workers, all sharing the one /dev/shm.
    in_flight = batch_bytes * rec.settings.batches_in_flight * rec.host.local_ranks
    if in_flight > free:
        severity = "critical"
        title = f"Batches in flight need about {mb(in_flight):g} MB of /dev/shm, but only {mb(free):g} MB is free"
        change = _shm_fitting_change(rec, batch_bytes, free)
    elif in_flight > SHM_WARNING_SHARE * free:
        severity = "warning"
        title = (
            f"Batches in flight would fill {percent(in_flight / free)} of the free /dev/shm "
            f"({mb(in_flight):g} of {mb(free):g} MB)"
        )
        change = {}  # a risk, not a failure: not worth slowing the loader for
    else:
        return None
    return Finding(
        rule="shm-capacity",
        severity=severity,
        title=title,
        evidence={
            "batch_mb": mb(batch_bytes),
            "prefetch_factor": rec.settings.prefetch_factor or DEFAULT_PREFETCH_FACTOR,
            "num_workers": rec.settings.num_workers,
            "local_ranks": rec.host.local_ranks,
            "shm_in_flight_mb": mb(in_flight),
            "shm_free_mb": mb(free),
            "shm_total_mb": None if rec.host.shm_total_bytes is None else mb(rec.host.shm_total_bytes),
        },
        fix=(
            "Workers hand batches over through /dev/shm, and a worker that finds it full dies with 'Bus error'. "
            "Give the container more (docker run --shm-size=8g, or --ipc=host), or lower num_workers or "
            "prefetch_factor."
        ),
        snippet=settings_snippet(rec, change),
        settings_change=change,
        impact=1.0 if severity == "critical" else 0.0,
    )


def stray_workers(rec: Recording) -> Finding | None:
    """Worker processes left by earlier runs keep cores busy. About the machine, not the loader: a report of
    several loaders shows it once (render/console.py, HOST_RULES)."""
    strays = rec.host.stray_workers
    if not strays:
        return None
    cpu_percent = sum(s.cpu_percent for s in strays)
    pids = " ".join(str(s.pid) for s in strays)
    noun, verb = ("process", "uses") if len(strays) == 1 else ("processes", "use")
    # Each by its program, never its arguments: a report saved before kept up to 200 characters of them.
    programs = [program_name(s.cmdline.split()) for s in strays]
    return Finding(
        rule="stray-workers",
        severity="critical" if cpu_percent > STRAY_CRITICAL_CPU_PERCENT else "warning",
        title=f"{len(strays)} worker {noun} left from earlier runs {verb} {cpu_percent:.0f}% CPU",
        evidence={
            "pids": [s.pid for s in strays],
            "programs": sorted(set(programs)),
            "cpu_percent": round(cpu_percent, 1),
        },
        fix=(
            "These are DataLoader workers of runs that were killed hard, whose parent is gone; they take cores "
            f"from this run until they end. End them with: kill {pids}"
        ),
        snippet=None,  # the kill is in the fix, which every report and log shows: not printed twice
        settings_change={},
        # The share of the usable cores they take.
        impact=min(1.0, cpu_percent / 100 / rec.host.usable_cores) if rec.host.usable_cores > 0 else 1.0,
    )
