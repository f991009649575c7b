"""HostSnapshot: what the host was at a run's start, plain data the history keeps so that a later run can say what
changed on the machine."""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import resource
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psutil
import torch

from loaderdoctor.host import facts as host
from loaderdoctor.host.facts import OtherProcess, StrayProcess
from loaderdoctor.plain.data import dataclass_from_dict

logger = logging.getLogger("loaderdoctor")

T = TypeVar("T")


@dataclass
class HostSnapshot:
    """The machine and this process at a run's start. Every fact is None where it could not be read;
    `other_processes` is filled by the caller at the run's end, from what OtherLoad measured during the run."""

    hostname: str | None = None
    cpu_count: int | None = None
    usable_cores: float | None = None  # affinity mask and cgroup quota taken into account
    affinity_cores: int | None = None
    cgroup_cpu_quota: float | None = None
    load_avg_1m: float | None = None
    load_avg_5m: float | None = None
    load_avg_15m: float | None = None
    memory_available_bytes: int | None = None
    memory_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    shm_used_bytes: int | None = None
    shm_total_bytes: int | None = None
    open_fds: int | None = None  # this process's
    fd_soft_limit: int | None = None  # None without a limit
    stray_workers: list[StrayProcess] | None = None  # orphaned DataLoader workers of earlier runs; [] when none
    python_version: str | None = None
    torch_version: str | None = None
    other_processes: list[OtherProcess] = field(default_factory=list)  # processes outside the run that took CPU

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostSnapshot:
        """The snapshot whose to_dict() is `data`; keys of a newer version are left out, missing ones are None."""
        known = {f.name for f in dataclasses.fields(cls)}
        return dataclass_from_dict(cls, {key: value for key, value in data.items() if key in known})


def _read(fact: Callable[[], T]) -> T | None:
    """`fact()`, or None when it fails: a snapshot never stops a run, whatever the platform lacks."""
    try:
        return fact()
    except Exception:
        logger.debug("host snapshot: %s could not be read", getattr(fact, "__name__", fact), exc_info=True)
        return None


def _fd_soft_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def take_snapshot() -> HostSnapshot:
    """The host as it is now, in a few milliseconds (host.stray_workers() adds 0.2 s when it finds candidates to
    sample); never raises."""
    cores = _read(host.usable_cores)
    load = _read(os.getloadavg)
    memory = _read(psutil.virtual_memory)
    swap = _read(psutil.swap_memory)
    shm = _read(lambda: shutil.disk_usage("/dev/shm"))
    return HostSnapshot(
        hostname=_read(socket.gethostname),
        cpu_count=_read(os.cpu_count),
        usable_cores=None if cores is None else cores[0],
        affinity_cores=None if cores is None else cores[1],
        cgroup_cpu_quota=None if cores is None else cores[2],
        load_avg_1m=None if load is None else round(load[0], 2),
        load_avg_5m=None if load is None else round(load[1], 2),
        load_avg_15m=None if load is None else round(load[2], 2),
        memory_available_bytes=None if memory is None else memory.available,
        memory_total_bytes=None if memory is None else memory.total,
        swap_used_bytes=None if swap is None else swap.used,
        swap_total_bytes=None if swap is None else swap.total,
        shm_used_bytes=None if shm is None else shm.used,
        shm_total_bytes=None if shm is None else shm.total,
        open_fds=_read(lambda: psutil.Process().num_fds()),
        fd_soft_limit=_read(_fd_soft_limit),
        stray_workers=_read(host.stray_workers),
        python_version=_read(platform.python_version),
        torch_version=_read(lambda: str(torch.__version__)),
    )
