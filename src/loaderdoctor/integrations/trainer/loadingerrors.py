"""Which errors a trainer's hooks see come from loading: raised within torch's DataLoader, or a worker's death."""

from __future__ import annotations

import os

import psutil

_TORCH_DATA_DIR = os.path.join("torch", "utils", "data") + os.sep


def raised_in_loading(error: BaseException) -> bool:
    """Whether `error` was raised from within torch's DataLoader (a sample that raised, a worker that died),
    rather than by the training step, a callback or a logger."""
    tb = error.__traceback__
    while tb is not None:
        if _TORCH_DATA_DIR in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def is_death_of(error: BaseException, worker_pids: list[int]) -> bool:
    """Whether `error` tells a worker's death, as the tap tells one: torch's RuntimeError while one of the
    workers `worker_pids` has ended."""
    return isinstance(error, RuntimeError) and any(_ended(pid) for pid in worker_pids)


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
