"""A DataLoader iterator's worker processes: which they are, and which of them have ended."""

from __future__ import annotations

import multiprocessing.connection
from typing import Any

_killed: set[int] = set()  # workers loaderdoctor itself ended (a stall's): their end is no death of theirs
_KILLED_KEPT = 4096


def note_killed(pids: list[int]) -> None:
    """loaderdoctor is ending these workers itself (SIGKILL after a stall)."""
    if len(_killed) > _KILLED_KEPT:
        _killed.clear()
    _killed.update(pids)


def killed_by_loaderdoctor(pid: int) -> bool:
    return pid in _killed


def worker_processes(iterator: Any) -> list[Any]:
    """A DataLoader iterator's worker processes (multiprocessing.Process; none for single-process loading)."""
    return [w for w in getattr(iterator, "_workers", []) if w.pid is not None]


def worker_pids(iterator: Any) -> list[int]:
    """The pids of a DataLoader iterator's worker processes (none for single-process loading)."""
    return [w.pid for w in worker_processes(iterator)]


def exited_workers(iterator: Any, grace_s: float = 0.0) -> list[int]:
    """The pids of a DataLoader iterator's workers whose process has ended, waiting up to grace_s for one to.
    How a worker's death is known: from the processes, never from the words of torch's message."""
    workers = worker_processes(iterator)
    if not workers:
        return []
    ended = set(multiprocessing.connection.wait([w.sentinel for w in workers], timeout=grace_s))
    return [w.pid for w in workers if w.sentinel in ended]
