"""HookedLoader on a fake clock: waits and steps from a trainer's batch hooks, a validation run set aside, the
first batch's start-up, a failed fetch; and which errors come from loading."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.integrations.trainer.hooked import HookedLoader
from loaderdoctor.integrations.trainer.loadingerrors import raised_in_loading
from loaderdoctor.recording.record import Recording, wait_fraction


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Raises(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        raise ValueError(f"sample {index} is corrupt")


def _hooked(clock: Clock, cpu: Clock, run_delay=lambda: None, num_workers: int = 0) -> HookedLoader:
    loader = DataLoader(list(range(40)), batch_size=4, num_workers=num_workers)
    return HookedLoader(
        "toy/train", [loader], batches_per_epoch=10, workers=lambda: [], clock=clock, cpu_clock=cpu, run_delay=run_delay
    )


def _batch(hooked: HookedLoader, clock: Clock, *, wait_s: float, step_s: float) -> None:
    clock.now += wait_s
    hooked.batch_started(torch.zeros(4, 2))
    clock.now += step_s
    hooked.batch_ended()


def test_waits_and_steps_come_from_the_hooks_and_a_validation_run_is_set_aside():
    clock, cpu = Clock(), Clock()
    hooked = _hooked(clock, cpu)
    hooked.epoch_started()
    _batch(hooked, clock, wait_s=0.5, step_s=0.02)  # the workers' start-up
    for _ in range(4):
        _batch(hooked, clock, wait_s=0.01, step_s=0.02)
    hooked.pause(hooked.idle_since)  # a validation run, 3 s, inside the epoch
    clock.now += 3.0
    hooked.resume()
    for _ in range(5):
        _batch(hooked, clock, wait_s=0.01, step_s=0.02)
    hooked.epoch_ended()
    stretch = hooked.stretch()
    report = hooked.finish(history=False, main=False)

    assert report is not None
    rec = report.recording
    assert [b.wait_s for b in rec.batches] == pytest.approx([0.5] + [0.01] * 9)
    assert [b.step_s for b in rec.batches] == pytest.approx([0.02] * 10)
    assert rec.epochs[0].first_batch_s == pytest.approx(0.5)
    assert rec.epochs[0].batches == 10
    assert wait_fraction(rec) == pytest.approx(1 / 3)
    assert stretch.batches == 10
    assert stretch.wait_fraction == pytest.approx(0.59 / 0.79)
    assert stretch.batches_per_s == pytest.approx(10 / 0.79)  # the validation's 3 s left out


def test_a_fetch_that_raises_is_a_sample_error_of_the_batch_waited_for():
    clock, cpu = Clock(), Clock()
    hooked = _hooked(clock, cpu)
    hooked.epoch_started()
    _batch(hooked, clock, wait_s=0.1, step_s=0.02)
    clock.now += 0.01
    hooked.failed(ValueError("sample 7 is corrupt"))
    report = hooked.finish(history=False, main=False)

    assert report is not None
    errors = report.recording.sample_errors
    assert [(e.epoch, e.batch, e.error_type) for e in errors] == [(0, 1, "ValueError")]


def test_an_epoch_with_no_batch_yet_is_not_recorded():
    clock, cpu = Clock(), Clock()
    hooked = _hooked(clock, cpu)
    hooked.epoch_started()
    clock.now += 1.0
    assert hooked.finish(history=False, main=False) is None


def test_errors_raised_in_the_dataloader_are_told_from_others():
    with pytest.raises(ValueError) as loading:
        next(iter(DataLoader(Raises(), batch_size=2)))
    assert raised_in_loading(loading.value)
    with pytest.raises(ValueError) as stepping:
        raise ValueError("the step's own")
    assert not raised_in_loading(stepping.value)


def _descheduled_between_the_hooks(num_workers: int) -> Recording:
    """Another process held the cores for 8 of each batch's 10 ms between the hooks (read from the thread's run
    delay, as the tap reads a loop's)."""
    clock, cpu, delay = Clock(), Clock(), Clock()
    hooked = _hooked(clock, cpu, run_delay=delay, num_workers=num_workers)
    hooked.epoch_started()
    for _ in range(10):
        clock.now += 0.01
        delay.now += 0.008
        hooked.batch_started(torch.zeros(4, 2))
        clock.now += 0.02
        hooked.batch_ended()
    hooked.epoch_ended()
    return hooked.finish(history=False, main=False).recording


def test_the_time_the_hooks_thread_was_descheduled_is_no_wait_for_data_where_workers_load():
    rec = _descheduled_between_the_hooks(num_workers=2)
    assert [b.wait_run_delay_s for b in rec.batches] == pytest.approx([0.008] * 10)
    assert wait_fraction(rec) == pytest.approx(0.002 / 0.03, rel=0.01)  # the machine's load, not the data's


def test_where_the_loops_thread_loads_its_time_descheduled_between_the_hooks_is_loading():
    rec = _descheduled_between_the_hooks(num_workers=0)
    assert wait_fraction(rec) == pytest.approx(0.01 / 0.03, rel=0.01)  # that thread was loading all along


class PreemptedCpuClock:
    """The process's CPU clock, read by a system call at which, once `armed`, other processes take the core for
    `taken_s`: the time passes, and the thread's run delay counts it."""

    def __init__(self, wall: Clock, taken_s: float) -> None:
        self.wall, self.taken_s, self.delay, self.armed = wall, taken_s, 0.0, False

    def __call__(self) -> float:
        if self.armed:
            self.armed = False
            self.wall.now += self.taken_s
            self.delay += self.taken_s
        return 0.0


def test_time_lost_reading_the_cpu_clock_at_the_end_hook_is_the_steps_not_a_wait_for_data():
    """Beside CPU hogs the end hook's first read after a step took the loop off its core for 2 to 4 ms a batch,
    after the wait's clock and before its run delay: a loop with nothing to load was told it waits 8% of the time."""
    clock = Clock()
    cpu = PreemptedCpuClock(clock, taken_s=0.003)
    hooked = _hooked(clock, cpu, run_delay=lambda: cpu.delay)
    hooked.epoch_started()
    for _ in range(10):
        clock.now += 0.0005
        hooked.batch_started(torch.zeros(4, 2))
        clock.now += 0.04
        cpu.armed = True  # the step ran its time slice out
        hooked.batch_ended()
    hooked.epoch_ended()
    rec = hooked.finish(history=False, main=False).recording
    assert wait_fraction(rec) < 0.02
    later = [b for b in rec.batches if b.index > 0]
    assert all(b.wait_s == pytest.approx(0.0005) for b in later)
    assert min(b.step_s for b in later[:-1]) == pytest.approx(0.043)  # the loop's own time: no time is lost
