"""A Workload: the loaders of a training job and the training step that consumes their batches."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor.errors import UsageError

Step = Callable[[Any], Any]  # a training step: takes a batch


def sleep_step(step_ms: float) -> Step:
    """A simulated training step: the accelerator works, the CPU is free."""
    seconds = step_ms / 1000.0

    def step(batch: Any) -> None:
        time.sleep(seconds)

    return step


@dataclass
class Workload:
    """What loaderdoctor measures: a train loader, an optional val loader, and the step between batches.

    step_ms simulates a training step of that many milliseconds (a sleep: an accelerator step leaves the CPU
    free); step is a real callable taking a batch. on_close releases what building the workload started.
    """

    train: DataLoader
    val: DataLoader | None = None
    step_ms: float | None = None
    step: Callable[[Any], Any] | None = None
    on_close: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.step_ms is not None and self.step is not None:
            raise UsageError("a Workload takes step_ms or step, not both")
        if self.step_ms is not None and not (math.isfinite(self.step_ms) and self.step_ms >= 0):
            raise UsageError(f"step_ms must be 0 or more, not {self.step_ms}")
        for name, loader in self.loaders().items():
            if not isinstance(loader, DataLoader):
                raise UsageError(
                    f"Workload.{name} must be a torch.utils.data.DataLoader, "
                    f"not {type(loader).__module__}.{type(loader).__name__}"
                )

    def loaders(self) -> dict[str, DataLoader]:
        """The loaders by name: {"train": ..., "val": ...} (val only when given)."""
        named = {"train": self.train}
        if self.val is not None:
            named["val"] = self.val
        return named

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()

    def training_step(self, step_ms: float | None = None) -> Step | None:
        """The step to run after each batch: a sleep of `step_ms` when given (it overrides the workload's
        own), else the workload's step or step_ms; None when there is none."""
        if step_ms is not None:
            if not (math.isfinite(step_ms) and step_ms >= 0):
                raise UsageError(f"the step must be 0 ms or more, not {step_ms}")
            return sleep_step(step_ms)
        if self.step is not None:
            return self.step
        return None if self.step_ms is None else sleep_step(self.step_ms)
