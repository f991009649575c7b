"""Facts about the host and the main process that decide how a DataLoader behaves on it."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

from loaderdoctor.recording import HostFacts, IteratorFacts, StrayProcess

# Threads loaderdoctor starts are named with this prefix, so they are never counted as the user's.
OWN_THREAD_PREFIX = "loaderdoctor-"
# multiprocessing's queue feeders serve earlier iterators' queues; workers never touch their locks.
_HARMLESS_THREADS = ("QueueFeederThread",)
_WORKER_MARKERS = ("multiprocessing.spawn", "multiprocessing.forkserver", "spawn_main")
_STRAY_CPU_SAMPLE_S = 0.2


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this cgroup in cores (cgroup v2 cpu.max or v1 cfs files), or None without a limit."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cores() -> tuple[float, int, float | None]:
    """(usable cores, cores in this process's affinity mask, cgroup quota in cores or None)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return float(min(affinity, quota) if quota else affinity), affinity, quota


def other_threads() -> list[str]:
    """Names of the threads alive in this process besides the main one and loaderdoctor's own."""
    return [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread()
        and not t.name.startswith(OWN_THREAD_PREFIX)
        and t.name not in _HARMLESS_THREADS
    ]


def native_threads() -> int:
    """OS threads of this process that Python's threading module did not start."""
    try:
        return max(0, psutil.Process().num_threads() - threading.active_count())
    except psutil.Error:
        return 0


def iterator_facts(epoch: int, start_method: str | None) -> IteratorFacts:
    """What holds in the main process now, just before an iterator forks or spawns its workers."""
    return IteratorFacts(
        epoch=epoch,
        start_method=start_method,
        threads=other_threads(),
        cuda_initialized=bool(torch.cuda.is_initialized()),
        inductor_loaded="torch._inductor" in sys.modules,
        native_threads=native_threads(),
    )


def _accelerator() -> str | None:
    return "cuda" if torch.cuda.is_available() else None


def _has_torch(proc: psutil.Process) -> bool:
    return any("libtorch" in m.path for m in proc.memory_maps(grouped=True))


def _orphaned_workers(orphans: list[psutil.Process]) -> list[psutil.Process]:
    """The orphans that are DataLoader workers beyond reasonable doubt: spawn/forkserver children, or forked
    siblings (two or more with one command line and process group, whose leader is gone) that load torch.
    A lone orphan running torch may be someone's training job started with nohup: never reported."""
    strays = []
    siblings: dict[tuple[str, int], list[psutil.Process]] = {}
    for proc in orphans:
        try:
            cmdline = " ".join(proc.cmdline())
            if any(marker in cmdline for marker in _WORKER_MARKERS):
                strays.append(proc)
            else:
                siblings.setdefault((cmdline, os.getpgid(proc.pid)), []).append(proc)
        except (psutil.Error, OSError):
            continue  # it ended meanwhile
    for (_, pgid), group in siblings.items():
        try:
            if len(group) >= 2 and not psutil.pid_exists(pgid) and _has_torch(group[0]):
                strays.extend(group)
        except (psutil.Error, OSError):
            continue
    return strays


def stray_workers() -> list[StrayProcess]:
    """Orphaned processes that look like DataLoader workers of earlier runs, with their CPU use."""
    own = os.getpid()
    orphans = []
    for proc in psutil.process_iter(["pid", "ppid", "name"]):
        if proc.info["ppid"] == 1 and proc.pid != own and "python" in (proc.info["name"] or "").lower():
            orphans.append(proc)
    candidates = []
    for proc in _orphaned_workers(orphans):
        with contextlib.suppress(psutil.Error):
            proc.cpu_percent(None)  # the first call starts the measurement
            candidates.append(proc)
    if not candidates:
        return []
    time.sleep(_STRAY_CPU_SAMPLE_S)
    strays = []
    for proc in candidates:
        try:
            strays.append(
                StrayProcess(
                    pid=proc.pid,
                    cmdline=" ".join(proc.cmdline())[:200],
                    cpu_percent=proc.cpu_percent(None),
                    age_s=time.time() - proc.create_time(),
                )
            )
        except psutil.Error:
            continue
    return strays


def _local_ranks() -> int:
    """Processes of this job on this machine, as torchrun tells them (1 outside torchrun)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def host_facts() -> HostFacts:
    """The host as a loader started now would see it."""
    cores, affinity, quota = usable_cores()
    try:
        shm = shutil.disk_usage("/dev/shm")
        shm_free, shm_total = shm.free, shm.total
    except OSError:
        shm_free = shm_total = None
    try:
        open_fds: int | None = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = None
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return HostFacts(
        cpu_count=os.cpu_count() or 1,
        usable_cores=cores,
        affinity_cores=affinity,
        cgroup_cpu_quota=quota,
        shm_free_bytes=shm_free,
        shm_total_bytes=shm_total,
        open_fds=open_fds,
        fd_soft_limit=None if soft_limit == resource.RLIM_INFINITY else soft_limit,
        sharing_strategy=torch.multiprocessing.get_sharing_strategy(),
        local_ranks=_local_ranks(),
        accelerator=_accelerator(),
        stray_workers=stray_workers(),
    )
