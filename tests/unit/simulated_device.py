"""An asynchronous device on a fake clock, for the measurements that must wait for one: the loop launches a step's
work and goes on at once; the device does it in order; a wait for it moves the clock to when it is done."""

from __future__ import annotations


class SimulatedDevice:
    def __init__(self) -> None:
        self.now = 0.0  # the clock
        self.free_at = 0.0  # when the device will have done the work queued so far
        self.waits = 0

    def clock(self) -> float:
        return self.now

    def launch(self, cpu_s: float, device_s: float) -> None:
        """A step: `cpu_s` of the loop's time to launch `device_s` of the device's work."""
        self.now += cpu_s
        self.free_at = max(self.free_at, self.now) + device_s

    def wait(self) -> bool:
        self.now = max(self.now, self.free_at)
        self.waits += 1
        return True
