"""check's data-free windows (probe/datafree.py): the step on one batch, window after window; on an asynchronous
device each window holds its own steps' work."""

from __future__ import annotations

import pytest
from simulated_device import SimulatedDevice

from loaderdoctor.probe.datafree import DataFreeWindows


def test_a_window_on_an_asynchronous_device_holds_its_steps_work_not_their_launches():
    device = SimulatedDevice()
    device.launch(cpu_s=0.0, device_s=0.5)  # work the loop queued before the window: not the window's

    def step(batch: object) -> None:
        device.launch(cpu_s=0.001, device_s=0.020)  # launched in 1 ms, done by the device in 20

    windows = DataFreeWindows(step, "batch", device.clock, wait_for_device=device.wait)
    windows.run(0.05)
    windows.run(0.05)
    assert windows.windows == 2 and device.waits == 4
    assert windows.rate == pytest.approx(1 / 0.020, rel=0.05)  # not 1000 a second, nor slowed by the 0.5 s before


def test_a_step_that_raises_ends_the_windows():
    def step(batch: object) -> None:
        raise ValueError("bad batch")

    windows = DataFreeWindows(step, "batch", lambda: 0.0, wait_for_device=lambda: False)
    windows.run(0.05)
    windows.run(0.05)
    assert windows.windows == 0 and windows.rate is None and not windows.ran
