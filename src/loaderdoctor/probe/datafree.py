"""The loop's ceiling in check: windows of the training step on one batch, again and again, taken in turns beside
the verification's windows (probe/verify.py), so that the fix's rate is measured as a share of what the loop
would run at with a perfect input, under the same load. On an asynchronous device (a GPU), a window's clock is read
after the device did the work queued so far, at its start and its end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loaderdoctor.errors import StopMeasuring
from loaderdoctor.host.accelerator import wait_for_devices
from loaderdoctor.loader.workload import Step

MIN_STEPS = 5  # a window runs at least this many steps, however long they take


class DataFreeWindows:
    """The step on `batch` (a batch the original settings delivered, kept as delivered), window after window:
    no loader, no wait. Its rate is the loop's ceiling: steps per second over every window."""

    def __init__(
        self,
        step: Step,
        batch: Any,
        clock: Callable[[], float],
        wait_for_device: Callable[[], bool] = wait_for_devices,
    ) -> None:
        self.step = step
        self.batch = batch
        self.clock = clock
        self.wait_for_device = wait_for_device
        self.steps = 0
        self.seconds = 0.0
        self.windows = 0
        self.ran = True  # a step that raised ends the windows (the sessions said what it raised)

    def run(self, seconds: float) -> None:
        """One window of about `seconds` (at least MIN_STEPS steps)."""
        if not self.ran:
            return
        self.wait_for_device()  # the work queued before the window is not the window's
        began = self.clock()
        steps = 0
        try:
            while steps < MIN_STEPS or self.clock() - began < seconds:
                self.step(self.batch)
                steps += 1
        except StopMeasuring:
            pass  # the step ended the window (ranks stop together)
        except Exception:
            self.ran = False
            return
        self.wait_for_device()  # nor is the window's own work left queued after it
        self.steps += steps
        self.seconds += self.clock() - began
        self.windows += 1

    @property
    def rate(self) -> float | None:
        """Batches per second with the input taken away, None before a window ran."""
        return self.steps / self.seconds if self.steps and self.seconds > 0 else None

    def close(self) -> None:
        """Let the batch go."""
        self.batch = None
