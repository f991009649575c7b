"""HookedLoader.batches_stepped on a fake clock: a trainer that fetches several batches before one step hook (Hugging
Face's, accumulating gradients) has them recorded as batches taking turns, the wait and the steps shared evenly,
time set aside left out; and a loader given only a batch sampler reads that sampler's batch size."""

from __future__ import annotations

import pytest
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from loaderdoctor.integrations.trainer.hooked import HookedLoader
from loaderdoctor.recording.record import wait_fraction


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _hooked(clock: Clock, cpu: Clock, loader: DataLoader | None = None) -> HookedLoader:
    loader = loader or DataLoader(list(range(48)), batch_size=4)
    return HookedLoader("toy/train", [loader], batches_per_epoch=12, workers=lambda: [], clock=clock, cpu_clock=cpu,
                        kind="huggingface", run_delay=lambda: None)  # fmt: skip


def _step(hooked: HookedLoader, clock: Clock, cpu: Clock, *, count: int, wait_s: float, step_s: float) -> None:
    clock.now += wait_s
    cpu.now += wait_s / 10
    started = hooked.moment()
    clock.now += step_s
    hooked.batches_stepped(count, started)


def test_batches_fetched_before_one_step_are_recorded_each_with_its_share():
    clock, cpu = Clock(), Clock()
    hooked = _hooked(clock, cpu)
    hooked.epoch_started()
    for _ in range(4):  # 4 optimizer steps of 3 batches: 0.3 s fetching them, 0.06 s stepping on them
        _step(hooked, clock, cpu, count=3, wait_s=0.3, step_s=0.06)
    hooked.epoch_ended()
    report = hooked.finish(history=False, main=False)

    assert report is not None
    rec = report.recording
    assert rec.epochs[0].batches == 12 and len(rec.batches) == 12
    assert [b.wait_s for b in rec.batches] == pytest.approx([0.1] * 12)
    assert [b.wait_cpu_s for b in rec.batches] == pytest.approx([0.01] * 12)
    assert [b.step_s for b in rec.batches] == pytest.approx([0.02] * 12)
    assert [b.samples for b in rec.batches] == [4] * 12
    assert rec.epochs[0].first_batch_s == pytest.approx(0.1)
    assert wait_fraction(rec) == pytest.approx(1.2 / 1.44)
    assert rec.epochs[0].wall_s == pytest.approx(1.44)
    assert report.findings[0].rule == "input-bound"


def test_time_set_aside_between_steps_is_no_wait_and_a_single_batch_step_is_one_batch():
    clock, cpu = Clock(), Clock()
    hooked = _hooked(clock, cpu)
    hooked.epoch_started()
    _step(hooked, clock, cpu, count=2, wait_s=0.04, step_s=0.2)
    hooked.pause(hooked.idle_since)  # an evaluation, 5 s, after the step
    clock.now += 5.0
    hooked.resume()
    _step(hooked, clock, cpu, count=2, wait_s=0.04, step_s=0.2)
    _step(hooked, clock, cpu, count=1, wait_s=0.02, step_s=0.1)
    report = hooked.finish(history=False, main=False)

    assert report is not None
    rec = report.recording
    assert [b.wait_s for b in rec.batches] == pytest.approx([0.02] * 5)
    assert [b.step_s for b in rec.batches] == pytest.approx([0.1] * 5)
    assert wait_fraction(rec) == pytest.approx(1 / 6)


def test_a_loader_given_only_a_batch_sampler_reads_its_batch_size():
    # accelerate's prepare() makes every loader so: DataLoader(dataset, batch_sampler=...), its batch_size None.
    loader = DataLoader(list(range(48)), batch_sampler=BatchSampler(SequentialSampler(range(48)), 6, False))
    assert loader.batch_size is None
    clock, cpu = Clock(), Clock()
    hooked = _hooked(clock, cpu, loader)
    hooked.epoch_started()
    _step(hooked, clock, cpu, count=2, wait_s=0.04, step_s=0.2)
    report = hooked.finish(history=False, main=False)

    assert report is not None
    assert report.recording.batch_size == 6
    assert [b.samples for b in report.recording.batches] == [6, 6]
