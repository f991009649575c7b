"""The guard: a drop-in DataLoader that never hangs forever on its workers and never loses a sample."""

from __future__ import annotations

import logging
from typing import Any

import torch.utils.data
from torch.utils.data.dataloader import DataLoader as _TorchDataLoader  # torch's own, even while patch() is on

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.batchplan import check_resumable
from loaderdoctor.guard.compat import unguardable
from loaderdoctor.guard.events import GuardEvent
from loaderdoctor.guard.loader import GuardedLoader
from loaderdoctor.guard.patch import is_patched, patch, patched, unpatch
from loaderdoctor.tap.watchdog import StallPolicy

log = logging.getLogger("loaderdoctor")

__all__ = ["DataLoader", "GuardEvent", "GuardedLoader", "guard", "is_patched", "patch", "patched", "unpatch"]


def guard(
    loader: torch.utils.data.DataLoader,
    *,
    stall_timeout: float | StallPolicy | None = None,
    max_restarts: int = 3,
    persistent_workers: bool | None = None,
    on_sample_error: str = "raise",
    max_bad_fraction: float = 0.01,
) -> GuardedLoader | torch.utils.data.DataLoader:
    """`loader`, guarded: the same batches in the same order, its stalls and dead workers recovered from.
    Any map-style dataset; an IterableDataset when it offers state_dict()/load_state_dict() (see GuardedLoader).

    stall_timeout: None for adaptive deadlines (see StallPolicy), a number of seconds for both the first
    batch and the later ones, or a StallPolicy. max_restarts: restarts allowed over the loader's life.
    persistent_workers: None turns them on (a loader object cannot tell an explicit False from the
    default); False keeps workers that restart every epoch.
    on_sample_error: "raise" (a sample that raises fails its batch with an error of its own class naming its
    index) or "skip" (it is replaced by the next index that loads, and recorded; see guard/samples.py).
    max_bad_fraction: under "skip", the share of bad samples past which the run ends with an error, once the
    samples seen (over the loader's life) show it at 99.9% confidence, so a few bad samples met early do not.
    On a torch whose internals the guard cannot use (see guard/compat.py), `loader` itself, unchanged, with one
    LoaderDoctorWarning per process.
    """
    if unguardable(stacklevel=2):
        return loader
    return GuardedLoader(
        loader,
        stall_timeout=stall_timeout,
        max_restarts=max_restarts,
        persistent_workers=persistent_workers,
        on_sample_error=on_sample_error,
        max_bad_fraction=max_bad_fraction,
    )


def DataLoader(  # named like the class it stands in for
    *args: Any,
    stall_timeout: float | StallPolicy | None = None,
    max_restarts: int = 3,
    on_sample_error: str = "raise",
    max_bad_fraction: float = 0.01,
    **kwargs: Any,
) -> GuardedLoader | torch.utils.data.DataLoader:
    """A torch.utils.data.DataLoader made from the same arguments, guarded (see guard()). An IterableDataset
    without state_dict()/load_state_dict(), which the guard cannot resume, gets torch's DataLoader as it is,
    said in the log; so does every loader on a torch whose internals the guard cannot use, with one
    LoaderDoctorWarning per process."""
    loader = _TorchDataLoader(*args, **kwargs)
    if unguardable(stacklevel=2):
        return loader
    try:
        check_resumable(loader)
    except UsageError as error:
        log.warning("loaderdoctor.DataLoader: this DataLoader is not guarded: %s", error.message)
        return loader
    return guard(
        loader,
        stall_timeout=stall_timeout,
        max_restarts=max_restarts,
        persistent_workers=kwargs.get("persistent_workers"),
        on_sample_error=on_sample_error,
        max_bad_fraction=max_bad_fraction,
    )
