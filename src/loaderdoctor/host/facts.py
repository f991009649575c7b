"""Facts about the host and the main process that decide how a DataLoader behaves on it."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import resource
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import psutil
import torch


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
class OtherProcess:
    """A process outside this run (not the training process or its workers) that took CPU while it ran."""

    pid: int
    cmdline: str
    cores: float  # CPU seconds per second of the run
    # Whether it runs as the user of this run (None: unknown, or a report saved before it was read): another
    # user's process is theirs to end or renice, not this user's.
    same_user: bool | None = None


# Threads loaderdoctor starts are named with this prefix, so they are never counted as the user's.
OWN_THREAD_PREFIX = "loaderdoctor-"


def thread_frames() -> dict[int, FrameType]:
    """Each other thread's current frame, by thread id: sys._current_frames() with the garbage collector paused. A
    collection started inside it may run a finalizer that releases the GIL while CPython holds its thread-list
    lock, and deadlock with a thread that is exiting (CPython gh-106883, fixed after Python 3.11.7). The calling
    thread's own frame is left out: the caller's frame would hold the dict that holds that frame, a cycle that
    keeps every frame below it (a tap's iterator, a loader and its persistent workers) for the collector."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        frames = sys._current_frames()
    finally:
        if enabled:
            gc.enable()
    frames.pop(threading.get_ident(), None)
    return frames


_PYTHON = re.compile(r"(python|pypy)[0-9.]*[a-z]?(\.exe)?", re.IGNORECASE)
# The interpreter's options that take the next argument as their value ("-W ignore"; "-Wignore" takes none).
_PYTHON_VALUED = ("-W", "-X", "--check-hash-based-pycs")


def program_name(argv: Sequence[str], name: str = "") -> str:
    """A process named by its program, never by its arguments (another job's command line can hold a password):
    the executable's base name ("python3"; a title such as "nginx: worker process" by its first word; `name`, the
    kernel's name for it, when its command line is unknown), and for a Python process the script or module it
    runs ("python3 train_b.py", "python3 -m torch.distributed.run", "python3 -c"). Applied to a name it gave, or
    to a whole command line split at spaces (what older reports kept), it gives the same."""
    words = argv[0].split() if argv else []  # a title set in place of argv[0] can hold the arguments too
    program = words[0].rstrip(":") if words else ""
    if program.startswith(("/", ".", "~")):  # a path; a kernel thread's name ("kworker/0:1") is none
        program = os.path.basename(program.rstrip("/"))
    program = program or name
    if not _PYTHON.fullmatch(program):
        return program
    args = iter(argv[1:])
    for arg in args:
        if arg in _PYTHON_VALUED:
            next(args, None)
        elif arg == "-m":
            return f"{program} -m {next(args, '')}".rstrip()
        elif arg == "-c" or arg == "-" or arg.startswith("-c"):
            return f"{program} {arg[:2]}"
        elif not arg.startswith("-") and arg.strip():
            return f"{program} {os.path.basename(arg.strip().rstrip('/'))}"
    return program


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
                    cmdline=program_name(proc.cmdline(), proc.name()),
                    cpu_percent=proc.cpu_percent(None),
                    age_s=time.time() - proc.create_time(),
                )
            )
        except psutil.Error:
            continue
    return strays


# A process outside the run that used less than this share of a core is not worth naming.
_NAMED_OTHER_CORES = 0.1
_NAMED_OTHERS = 5
_NAMED_OTHER_CPU_S = 0.05  # CPU seconds after which a process's program is read (program_name)

CpuSnapshot = dict[tuple[int, float], tuple[float, str]]  # (pid, creation time) -> (CPU seconds, process name)


def cpu_snapshot() -> CpuSnapshot:
    """The CPU seconds every process of the machine has used so far, by pid and creation time."""
    snapshot: CpuSnapshot = {}
    for proc in psutil.process_iter(["cpu_times", "create_time", "name"]):
        times, created = proc.info["cpu_times"], proc.info["create_time"]
        if times is not None and created is not None:
            snapshot[(proc.pid, created)] = (times.user + times.system, proc.info["name"] or "")
    return snapshot


def _own_tree() -> set[int]:
    """This process and all its descendants (workers, the forkserver, compile workers)."""
    own = psutil.Process()
    pids = {own.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(child.pid for child in own.children(recursive=True))
    return pids


class OtherLoad:
    """The CPU that processes outside this one and its children take while a run goes on, from snapshots of
    every process taken now and then (at each window's end): a process that starts or ends during the run is
    counted for the time it was seen, as a job that comes and goes."""

    def __init__(
        self,
        snapshot: Callable[[], CpuSnapshot] = cpu_snapshot,
        own: Callable[[], set[int]] = lambda: _own_tree(),
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._snapshot, self._own, self._wall_clock = snapshot, own, wall_clock
        self._taken_at = wall_clock()
        self._last = snapshot()
        self._used: dict[tuple[int, float], float] = {}  # CPU seconds taken since the first snapshot
        self._commands: dict[tuple[int, float], str] = {}
        self._same_user: dict[tuple[int, float], bool | None] = {}

    def observe(self) -> None:
        """Take a snapshot and add what each other process used since the last one."""
        taken_at = self._wall_clock()
        now, own = self._snapshot(), self._own()
        for key, (cpu_s, name) in now.items():
            if key[0] in own:
                continue
            if key in self._last:
                used = cpu_s - self._last[key][0]
            elif key[1] >= self._taken_at:
                used = cpu_s  # started since the last snapshot: all its CPU is new
            else:
                continue  # not read last time (it was denied, say): no baseline
            if used <= 0:
                continue
            self._used[key] = self._used.get(key, 0.0) + used
            if key not in self._commands and self._used[key] >= _NAMED_OTHER_CPU_S:
                self._commands[key] = _program(key[0], name)  # read while it still runs
                self._same_user[key] = _runs_as_this_user(key[0])
        self._last, self._taken_at = now, taken_at

    def busiest(self, seconds: float) -> list[OtherProcess]:
        """The processes that used the most CPU over the run of `seconds` (at least a tenth of a core each on
        average), busiest first."""
        if seconds <= 0:
            return []
        ranked = sorted(((used / seconds, key) for key, used in self._used.items()), reverse=True)
        return [
            OtherProcess(key[0], self._commands.get(key, ""), round(cores, 2), self._same_user.get(key))
            for cores, key in ranked[:_NAMED_OTHERS]
            if cores >= _NAMED_OTHER_CORES
        ]


def _runs_as_this_user(pid: int) -> bool | None:
    """Whether the process's real user is this process's; None where it cannot be read (it ended)."""
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).uids().real == os.getuid()
    return None


def _program(pid: int, name: str) -> str:
    """What a process runs, without its arguments (program_name); its name alone when its command line cannot be
    read."""
    with contextlib.suppress(psutil.Error):
        return program_name(psutil.Process(pid).cmdline(), name) or name
    return program_name([], name)


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
