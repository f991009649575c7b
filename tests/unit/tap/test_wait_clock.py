"""The wait for a batch, as the tap times it, holds next() alone: the CPU clock and run delay read around it are
the loop's own time."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from loaderdoctor.tap import iterator as tap_iterator
from loaderdoctor.tap.iterator import Tap


class StillClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Ticking:
    """Batches that each take `wait_s` of the clock to come."""

    def __init__(self, clock: StillClock, wait_s: float, count: int) -> None:
        self.clock, self.wait_s, self.left = clock, wait_s, count

    def __next__(self):
        if not self.left:
            raise StopIteration
        self.left -= 1
        self.clock.now += self.wait_s
        return [0, 1]


def test_time_lost_reading_the_cpu_clock_before_next_is_the_steps_not_a_wait(monkeypatch):
    """Beside CPU hogs the first system call after a step takes the loop off its core for a few ms: read after the
    wait's clock (and before its run delay), the CPU clock's read was a wait for data."""
    clock, preempt = StillClock(), {"armed": False, "delay": 0.0}

    def process_time() -> float:
        if preempt["armed"]:
            preempt["armed"] = False
            clock.now += 0.003
            preempt["delay"] += 0.003
        return 0.0

    monkeypatch.setattr(tap_iterator.time, "process_time", process_time)
    monkeypatch.setattr(tap_iterator, "thread_run_delay_s", lambda: preempt["delay"])
    events: list = []
    loader = DataLoader(list(range(8)), batch_size=2)
    batches = Ticking(clock, 0.0005, 5)
    tap = Tap(loader, [events.append], start_method=None, clock=clock, open_iterator=lambda _: batches)
    for _ in tap.epoch(0):
        clock.now += 0.04  # the step, which runs its time slice out
        preempt["armed"] = True
    waits = [e.wait_s for e in events if type(e).__name__ == "BatchDelivered"][1:]
    assert waits and all(w == pytest.approx(0.0005, abs=1e-9) for w in waits), waits
