"""The guard: a drop-in DataLoader that never hangs forever on its workers and never loses a sample."""

from __future__ import annotations

from typing import Any

import torch.utils.data

from loaderdoctor.guard.events import GuardEvent
from loaderdoctor.guard.loader import GuardedLoader
from loaderdoctor.watchdog import StallPolicy

__all__ = ["DataLoader", "GuardEvent", "GuardedLoader", "guard"]


def guard(
    loader: torch.utils.data.DataLoader,
    *,
    stall_timeout: float | StallPolicy | None = None,
    max_restarts: int = 3,
    persistent_workers: bool | None = None,
) -> GuardedLoader:
    """`loader`, guarded: the same batches in the same order, its stalls and dead workers recovered from.

    stall_timeout: None for adaptive deadlines (see StallPolicy), a number of seconds for both the first
    batch and the later ones, or a StallPolicy. max_restarts: restarts allowed over the loader's life.
    persistent_workers: None turns them on (a loader object cannot tell an explicit False from the
    default); False keeps workers that restart every epoch.
    """
    return GuardedLoader(
        loader, stall_timeout=stall_timeout, max_restarts=max_restarts, persistent_workers=persistent_workers
    )


def DataLoader(  # named like the class it stands in for
    *args: Any,
    stall_timeout: float | StallPolicy | None = None,
    max_restarts: int = 3,
    **kwargs: Any,
) -> GuardedLoader:
    """A torch.utils.data.DataLoader made from the same arguments, guarded (see guard())."""
    loader = torch.utils.data.DataLoader(*args, **kwargs)
    return guard(
        loader,
        stall_timeout=stall_timeout,
        max_restarts=max_restarts,
        persistent_workers=kwargs.get("persistent_workers"),
    )
