"""Where the workers' main threads spent their time, line by line, and the file locks they took: plain data
of a Recording, sampled from inside each worker (see workers/sites.py) and joined over workers or ranks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# A recording keeps every site where a lock was waited on, and the busiest of the others.
MAX_SITES = 40


@dataclass
class WorkerSite:
    """One line of code where the workers' main threads were found, with the time they spent there, all
    workers together: the innermost frame of the user's code (else the innermost frame)."""

    file: str
    line: int
    function: str
    lock: str | None  # the lock call in progress there ("fcntl.flock", "threading.Lock.acquire"), else None
    wall_s: float
    cpu_s: float  # CPU the main threads used meanwhile
    samples: int
    workers: int = 1  # how many workers were seen there

    @property
    def waiting_s(self) -> float:
        """Wall time at this line with the CPU idle: blocked (on a lock, on storage), not computing."""
        return max(0.0, self.wall_s - self.cpu_s)

    def where(self) -> str:
        """'file.py:12 in function'."""
        return f"{self.file}:{self.line} in {self.function}"


@dataclass
class LockCalls:
    """File-lock calls (fcntl.flock, fcntl.lockf, os.lockf) the workers made, by the access mode of the file
    they locked; unlocks are not counted."""

    read_only_exclusive: int = 0
    read_only_shared: int = 0
    writable: int = 0  # on files opened for writing (or for reading and writing)
    made_free: int = 0  # calls on read-only files made no-ops (a lock-free run only)

    @property
    def read_only(self) -> int:
        return self.read_only_exclusive + self.read_only_shared

    def plus(self, other: LockCalls) -> LockCalls:
        return LockCalls(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))


@dataclass
class WorkerActivity:
    """How the workers' main threads spent their time, sampled from inside each worker, all workers together:
    the time sampled, of which the time they waited in torch's worker loop for their next indices (no work
    to do: idle), their CPU, the sites where they were found, and the file-lock calls they made."""

    workers: int
    sampled_s: float
    idle_s: float
    cpu_s: float
    samples: int
    sites: list[WorkerSite] = field(default_factory=list)  # busiest first
    lock_calls: LockCalls = field(default_factory=LockCalls)
    lock_free: bool = False  # whether lock calls on read-only files were made no-ops in this run

    @property
    def busy_s(self) -> float:
        """The sampled time the workers had work: in the dataset, collate, or sending batches."""
        return max(0.0, self.sampled_s - self.idle_s)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def busiest_sites(sites: list[WorkerSite]) -> list[WorkerSite]:
    """Every site where a lock was waited on, and the MAX_SITES busiest others; busiest first."""
    ordered = sorted(sites, key=lambda s: (-s.wall_s, s.file, s.line))
    others = {id(s) for s in [s for s in ordered if s.lock is None][:MAX_SITES]}
    return [s for s in ordered if s.lock is not None or id(s) in others]


def join_activities(parts: list[WorkerActivity]) -> WorkerActivity | None:
    """The activity of several workers (or of every rank's workers) as one: times, counts and calls added up,
    the same site of different workers made one; None when there is none."""
    if not parts:
        return None
    sites: dict[tuple[str, int, str, str | None], WorkerSite] = {}
    for part in parts:
        for site in part.sites:
            key = (site.file, site.line, site.function, site.lock)
            if key in sites:
                joined = sites[key]
                joined.wall_s += site.wall_s
                joined.cpu_s += site.cpu_s
                joined.samples += site.samples
                joined.workers += site.workers
            else:
                sites[key] = dataclasses.replace(site)
    lock_calls = LockCalls()
    for part in parts:
        lock_calls = lock_calls.plus(part.lock_calls)
    return WorkerActivity(
        workers=sum(p.workers for p in parts),
        sampled_s=sum(p.sampled_s for p in parts),
        idle_s=sum(p.idle_s for p in parts),
        cpu_s=sum(p.cpu_s for p in parts),
        samples=sum(p.samples for p in parts),
        sites=busiest_sites(list(sites.values())),
        lock_calls=lock_calls,
        lock_free=any(p.lock_free for p in parts),
    )
