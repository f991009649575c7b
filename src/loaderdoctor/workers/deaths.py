"""What ended a worker process: which one, its exit status or signal, the dataset index it held, and whether the
kernel's OOM killer acted meanwhile; told from the processes, never from the words of torch's message."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaderdoctor.workers.processes import exited_workers, worker_processes

# Signals a process's own code raises on itself (a bad pointer, a failed assertion in native code): a sample that
# ended a worker so is its cause. SIGKILL is not among them: the OOM killer picks whoever holds memory.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})


@dataclass
class WorkerDeath:
    epoch: int
    batch: int
    message: str
    pid: int | None = None  # the worker that ended (the first, when several did); None when unknown
    exitcode: int | None = None  # its exit status: -N when signal N ended it (-11 SIGSEGV, -9 SIGKILL)
    index: int | None = None  # the dataset index it was loading (map-style datasets), None when it held none
    oom_kill: bool | None = None  # whether the OOM killer acted meanwhile (its cgroup count rose); None: unknown


def _cgroup_paths() -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 memory-controller path, from /proc/self/cgroup."""
    unified = memory = None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            unified = parts[2]
        elif "memory" in parts[1].split(","):
            memory = parts[2]
    return unified, memory


def _oom_kill_count(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def oom_kills(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """How many processes the OOM killer has ended in this process's memory cgroup (v2's memory.events, v1's
    memory.oom_control), None where neither can be read. Compared before and after a death, it says whether the
    kernel ended the worker for want of memory."""
    unified, memory = _cgroup_paths()
    candidates = []
    if unified is not None:
        candidates += [root / unified.lstrip("/") / "memory.events", root / "memory.events"]
    if memory is not None:
        candidates += [root / "memory" / memory.lstrip("/") / "memory.oom_control"]
    candidates.append(root / "memory" / "memory.oom_control")
    for path in candidates:
        try:
            count = _oom_kill_count(path.read_text())
        except OSError:
            continue
        if count is not None:
            return count
    return None


# How long a worker whose end was seen may take to have an exit status: on a busy machine, more than a moment.
EXIT_STATUS_WAIT_S = 5.0


def signal_name(exitcode: int | None) -> str | None:
    """'SIGSEGV' for an exit status of -11; None when no signal ended the process."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def worker_death(
    iterator: Any,
    epoch: int,
    batch: int,
    error: BaseException,
    *,
    held: Callable[[int], int | None] = lambda worker_id: None,
    oom_kills_before: int | None = None,
) -> WorkerDeath:
    """The death of a worker of torch's `iterator`, raised as `error` at `batch`: the first worker that ended, its
    exit status, the index it held (`held(worker_id)`), and whether the OOM killer acted since `oom_kills_before`."""
    dead = set(exited_workers(iterator))
    pid = exitcode = index = None
    for worker_id, worker in enumerate(worker_processes(iterator)):
        if worker.pid in dead:
            if worker.exitcode is None:  # its pipe closes as it exits, before the kernel holds its exit status
                worker.join(timeout=EXIT_STATUS_WAIT_S)
            pid, exitcode, index = worker.pid, worker.exitcode, held(worker_id)
            break
    oom_now = oom_kills()
    oom = None if oom_now is None or oom_kills_before is None else oom_now > oom_kills_before
    return WorkerDeath(epoch, max(batch, 0), str(error), pid=pid, exitcode=exitcode, index=index, oom_kill=oom)
