"""A DataLoader iterator's worker processes: which they are, and which of them have ended."""

from __future__ import annotations

import multiprocessing.connection
from typing import Any


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
