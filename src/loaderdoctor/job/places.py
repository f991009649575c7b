"""Where each rank of a job is joined, put in the job's own store as the rank's first loader is iterated: its host
and the job folder of the `loaderdoctor run` that watches it. At their end, the ranks that another `run` joins (one
typed on every node, or on every rank) send rank 0 what they measured; the others are joined by rank 0's own run
(job/endmeeting.py)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable

from loaderdoctor.watch.rankceilings import JobStore

KEY_PREFIX = "loaderdoctor/run/script/"
_MAX_PLACE_BYTES = 4096


def place_key(rank: int) -> str:
    return f"{KEY_PREFIX}watched/{rank}"


def this_place(folder: str) -> str:
    """The place of this process, whose loaders the `run` of the job folder `folder` joins: that, and its host."""
    return f"{socket.gethostname()}\n{folder}"


def host_of(place: str) -> str:
    return place.split("\n", 1)[0]


def announce(job: JobStore, place: str) -> None:
    """Put this rank's `place` in the job's store. Never raises: a rank that could not be placed is one that rank
    0 does not wait for."""
    with contextlib.suppress(Exception):  # the store's errors (their classes differ between torch versions)
        job.store.set(place_key(job.rank), place)


def places(job: JobStore, ranks: Iterable[int]) -> dict[int, str]:
    """The places of `ranks` that were put in the job's store, by rank (the store's errors pass)."""
    found = {}
    for rank in ranks:
        key = place_key(rank)
        if job.store.check([key]):
            found[rank] = job.store.get(key)[:_MAX_PLACE_BYTES].decode(errors="replace")
    return found


def rank_0_elsewhere(job: JobStore, place: str) -> bool | None:
    """Whether rank 0 is joined by another `run` than this process's (at `place`); None when rank 0 was not
    watched (the store's errors pass)."""
    rank_0 = places(job, [0]).get(0)
    return None if rank_0 is None else rank_0 != place
