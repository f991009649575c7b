"""Schedules that raise once stepped past the number of steps they were planned for (torch's OneCycleLR, alone or
inside a SequentialLR): under the ceiling, where one is alive in the loop's process, an epoch that took data-free
steps keeps its length, so that the loop takes no step more than it planned."""

from __future__ import annotations

import gc
from typing import Any

import torch


def raising_schedule(scheduler: Any) -> str | None:
    """A schedule that raises past its planned steps, in words ("OneCycleLR is sized for 360 steps ..."); None for
    any other."""
    for inner in [scheduler, *(getattr(scheduler, "_schedulers", None) or [])]:
        if isinstance(inner, torch.optim.lr_scheduler.OneCycleLR):
            return f"OneCycleLR is sized for {inner.total_steps} steps and raises past them"
    return None


def live_raising_schedule() -> str | None:
    """The first such schedule alive in this process and not yet at its end (one a finished training left, in a
    notebook say, raises nothing more), among the objects the garbage collector tracks: looked for once per loader,
    as its turns begin (a fraction of a second in a large process); None where there is none."""
    for candidate in gc.get_objects():
        # type(), not isinstance(): isinstance reads an object's __class__, which a proxy's property computes
        kind = type(candidate)
        if issubclass(kind, torch.optim.lr_scheduler.OneCycleLR) and candidate.last_epoch < candidate.total_steps:
            return raising_schedule(candidate)
    return None
