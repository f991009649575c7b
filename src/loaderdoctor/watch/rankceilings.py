"""The job's ceiling under a trainer's own launcher (torchrun, accelerate launch, Lightning's DDP): as the training
ends every process puts its ceiling in the job's key-value store (the one torch.distributed's process group was made
with), and the main one reads the others' there, waiting a bounded time, and judges the job from them
(rules/ceiling.py's job_ceiling), as `run` does for the ranks it launches. No collective: a rank that does not hand
its ceiling (no callback with a ceiling there, or one that failed) costs the main one WAIT_S, said in a warning,
never a hang."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.plain.data import dataclass_from_dict
from loaderdoctor.rules.ceiling import job_ceiling
from loaderdoctor.rules.finding import Finding
from loaderdoctor.tap.ceiling import Ceiling

WAIT_S = 60.0  # the longest the main process waits for the other ranks' ceilings, in all
MAX_BYTES = 1 << 20  # a ceiling read from the store larger than this is refused
# Per key (a training, or a watch's name), this process's meetings so far: each rank counts its own the same way.
_meetings: dict[str, Iterator[int]] = collections.defaultdict(itertools.count)


@dataclasses.dataclass(frozen=True)
class JobStore:
    """The job's key-value store and this process's place in the job, as they were when taken: a watch takes them
    as its loop begins, so that its ranks still meet at its end after the user's destroy_process_group()."""

    store: Any
    rank: int
    world: int


def job_store() -> JobStore | None:
    """The job's store now, None outside a distributed run of two processes or more."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return JobStore(_get_default_store(), dist.get_rank(), dist.get_world_size())


def ranks_ceilings(
    ceiling: Ceiling | None,
    *,
    main: bool,
    wait_s: float = WAIT_S,
    job: JobStore | None = None,
    key: str = "training",
) -> dict[int, Ceiling] | None:
    """On the main process, every rank's ceiling by rank, this one's `ceiling` among them (a rank that measured
    none, or handed none within `wait_s`, is left out: a warning says which); on the others, None once theirs is
    handed. None outside a distributed run of two processes or more. `job`: the store to meet in (default: the
    job's now); `key`: what the ranks meet for (a watch's name, the same on every rank: watches that end in another
    order on another rank still meet their own)."""
    try:
        job = job if job is not None else job_store()
        if job is None:
            return None
        prefix = f"loaderdoctor/ceiling/{key}/{next(_meetings[key])}"
        data = dataclasses.asdict(ceiling) if ceiling is not None else None
        job.store.set(f"{prefix}/{job.rank}", json.dumps(data))
        if not main:
            return None
        ceilings = {job.rank: ceiling} if ceiling is not None else {}
        missing = _gather(job.store, prefix, [r for r in range(job.world) if r != job.rank], wait_s, ceilings)
    except Exception as error:  # the job's figure is not worth the training run's end
        _warn(f"could not gather the ranks' ceilings: {type(error).__name__}: {error}")
        return None
    if missing:
        _warn(f"no ceiling from rank {', '.join(map(str, missing))} within {wait_s:.0f} s (no callback with a "
              "ceiling there?): the job's ceiling is left out")  # fmt: skip
        return None
    return ceilings


def job_ceiling_finding(
    ceiling: Ceiling | None, *, main: bool, job: JobStore | None = None, key: str = "training"
) -> Finding | None:
    """The job's ceiling (job-ceiling) from every rank's, handed through the job's store (see ranks_ceilings), on the
    main process; None elsewhere, on a single process, or with fewer than two ranks measured."""
    ceilings = ranks_ceilings(ceiling, main=main, job=job, key=key)
    return job_ceiling(ceilings) if ceilings else None


def _gather(store: Any, prefix: str, ranks: list[int], wait_s: float, into: dict[int, Ceiling]) -> list[int]:
    """The ceilings of `ranks` read from the store into `into` (each key deleted once read), waiting `wait_s` in
    all; the ranks whose key did not come."""
    deadline = time.monotonic() + wait_s
    missing = []
    for rank in ranks:
        key = f"{prefix}/{rank}"
        try:
            store.wait([key], timedelta(seconds=max(0.01, deadline - time.monotonic())))
        except Exception:  # the store's timeout (its error class differs between torch versions)
            missing.append(rank)
            continue
        raw = store.get(key)
        store.delete_key(key)
        if len(raw) > MAX_BYTES:
            raise ValueError(f"rank {rank}'s ceiling is {len(raw)} bytes, more than {MAX_BYTES}")
        data = json.loads(raw)
        if data is not None:
            into[rank] = dataclass_from_dict(Ceiling, data)
    return missing


def _warn(message: str) -> None:
    warnings.warn(f"loaderdoctor {message}", LoaderDoctorWarning, stacklevel=3)
