"""What a measurement runs with (the loader, the training step, the stall policy, the clock, where progress goes),
one value handed from check, tune and scale to the probe, its sessions and the verification; the time each call
may take is that call's own (its share of a budget), not part of it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loaderdoctor.loader.settings import LoaderSpec
from loaderdoctor.loader.workload import Step
from loaderdoctor.tap.watchdog import StallPolicy


@dataclass(frozen=True)
class ProbeProgress:
    epoch: int
    epochs: int
    batches: int
    elapsed_s: float
    budget_s: float


Progress = Callable[[ProbeProgress], None]


@dataclass(frozen=True)
class Measuring:
    """The loader of `spec` (its settings are chosen per session), the training step called after each batch
    (None: none), when waiting counts as a stall, the clock every time is read from, and who hears of the
    figures so far (None: nobody)."""

    spec: LoaderSpec
    step: Step | None = None
    policy: StallPolicy = field(default_factory=StallPolicy)
    clock: Callable[[], float] = time.perf_counter
    progress: Progress | None = None

    def with_progress(self, progress: Progress | None) -> Measuring:
        """The same measuring, its figures going to `progress` (each of check's phases has its own)."""
        return dataclasses.replace(self, progress=progress)
