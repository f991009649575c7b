"""The torch internals the guard reaches into, checked once per process.

The guard (and the tap it is built on) uses a few private parts of torch.utils.data: the loader's `_iterator`,
the multi-process iterator's `_workers` and `_shutdown_workers()`, the worker module's `_worker_info` (what
get_worker_info() returns), `WorkerInfo`, `_generate_state()` and `_worker_loop`, the base seed each iter()
draws, the iterator's `_task_info`, and `ExceptionWrapper.reraise` (where a worker's error is raised again in
the main process). On a torch where one of them is gone or has another shape,
loaderdoctor.DataLoader, guard() and patch() leave loaders plain, with one LoaderDoctorWarning per process,
instead of failing somewhere inside a guarded epoch. Tested with torch 2.13.0 (pinned) and 2.14.1.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from loaderdoctor.errors import LoaderDoctorWarning

__all__ = ["internals_missing", "supported", "unguardable"]

_WORKER_INFO_FIELDS = {"id", "num_workers", "seed", "dataset"}


def _worker() -> Any:
    return importlib.import_module("torch.utils.data._utils.worker")


def _dataloader() -> Any:
    return importlib.import_module("torch.utils.data.dataloader")


def _takes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    inspect.signature(fn).bind(*args, **kwargs)  # a TypeError when it does not
    return True


def _worker_info_global() -> bool:
    """get_worker_info() returns the worker module's `_worker_info`, which the guard replaces in its workers."""
    worker = _worker()
    get_worker_info = importlib.import_module("torch.utils.data").get_worker_info
    return (
        hasattr(worker, "_worker_info")
        and get_worker_info.__globals__ is vars(worker)
        and "_worker_info" in get_worker_info.__code__.co_names
    )


def _worker_info_class() -> bool:
    info = _worker().WorkerInfo
    if dataclasses.is_dataclass(info):
        return {field.name for field in dataclasses.fields(info)} >= _WORKER_INFO_FIELDS
    return _takes(info, id=0, num_workers=1, seed=0, dataset=None)  # torch before 2.6: a plain class


def _base_seed() -> bool:
    """Each iter() draws the workers' base seed from loader.generator: the guard's batch plan makes that draw."""
    names = _dataloader()._BaseDataLoaderIter.__init__.__code__.co_names
    return {"_base_seed", "random_"} <= set(names)


def _reraise() -> bool:
    """torch re-raises a worker's exception in ExceptionWrapper.reraise: where the guard tells the dataset's own
    errors from failures (guard/recovery.py)."""
    reraise = importlib.import_module("torch._utils").ExceptionWrapper.reraise
    return (
        inspect.isfunction(reraise)
        and "reraise" in _dataloader()._MultiProcessingDataLoaderIter._process_data.__code__.co_names
    )


def _task_info() -> bool:
    """_MultiProcessingDataLoaderIter._task_info (task -> (worker id,) while in flight): the batches a dead worker
    had in hand."""
    return "_task_info" in _dataloader()._MultiProcessingDataLoaderIter._reset.__code__.co_names


_CHECKS: tuple[tuple[str, Callable[[], bool]], ...] = (
    ("torch.utils.data._utils.worker._worker_info (read by get_worker_info())", _worker_info_global),
    ("torch.utils.data._utils.worker.WorkerInfo(id, num_workers, seed, dataset)", _worker_info_class),
    (
        "torch.utils.data._utils.worker._generate_state(base_seed, worker_id)",
        lambda: _takes(_worker()._generate_state, 0, 0),
    ),
    ("torch.utils.data._utils.worker._worker_loop", lambda: inspect.isfunction(_worker()._worker_loop)),
    (
        "torch.utils.data._utils.pin_memory.pin_memory(data)",
        lambda: _takes(importlib.import_module("torch.utils.data._utils.pin_memory").pin_memory, None),
    ),
    ("DataLoader._iterator", lambda: vars(_dataloader().DataLoader([0]))["_iterator"] is None),
    (
        "_MultiProcessingDataLoaderIter._workers",
        lambda: "_workers" in _dataloader()._MultiProcessingDataLoaderIter.__init__.__code__.co_names,
    ),
    (
        "_MultiProcessingDataLoaderIter._shutdown_workers()",
        lambda: _takes(_dataloader()._MultiProcessingDataLoaderIter._shutdown_workers, None),
    ),
    ("_BaseDataLoaderIter's base seed drawn from loader.generator", _base_seed),
    ("torch._utils.ExceptionWrapper.reraise, called by _process_data", _reraise),
    ("_MultiProcessingDataLoaderIter._task_info", _task_info),
)


def _holds(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:  # gone (AttributeError, ImportError, KeyError) or of another shape (TypeError, ...)
        return False


@functools.cache
def _missing() -> tuple[str, ...]:
    return tuple(name for name, check in _CHECKS if not _holds(check))


def internals_missing() -> list[str]:
    """The torch internals the guard needs that this torch lacks or has in another shape (checked once)."""
    return list(_missing())


def supported() -> str | None:
    """None when the guard can run on this torch; else why not, in one line."""
    missing = _missing()
    if not missing:
        return None
    return f"torch {torch.__version__} lacks internals the guard relies on: {'; '.join(missing)}"


_warned = False
_warned_lock = threading.Lock()


def unguardable(stacklevel: int = 1) -> bool:
    """Whether loaders must stay plain on this torch; the first time it is so, one LoaderDoctorWarning says why
    (`stacklevel` as for warnings.warn, counted from the caller of this function)."""
    global _warned
    reason = supported()
    if reason is None:
        return False
    with _warned_lock:
        first, _warned = not _warned, True
    if first:
        warnings.warn(
            f"loaderdoctor: {reason}. DataLoaders run unguarded (torch's plain DataLoader) in this process; the "
            "guard is tested with torch 2.13.0 to 2.14.1",
            LoaderDoctorWarning,
            stacklevel=stacklevel + 1,
        )
    return True
