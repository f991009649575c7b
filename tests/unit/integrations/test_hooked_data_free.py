"""HookedLoader on a fake clock with the ceiling's data-free steps (a trainer's callback with ceiling=...): such a
step is no batch of the run, its time is neither a wait nor a step, the time before it stays the next batch's
wait, and a step that accumulates real and data-free batches records the real ones alone; TrainerCeiling says
which batches a trainer steps on were handed again, and how far an epoch must be lengthened for them."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from loaderdoctor.integrations.trainer.ceiling import TrainerCeiling, TurnsLoader
from loaderdoctor.integrations.trainer.hooked import HookedLoader
from loaderdoctor.recording.record import wait_fraction


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _hooked(clock: Clock) -> HookedLoader:
    loader = DataLoader(list(range(48)), batch_size=4)
    return HookedLoader("toy/train", [loader], batches_per_epoch=12, workers=lambda: [], clock=clock,
                        cpu_clock=clock, run_delay=lambda: None)  # fmt: skip


def _real(hooked: HookedLoader, clock: Clock, *, wait_s: float, step_s: float) -> None:
    clock.now += wait_s
    hooked.batch_started([0, 1, 2, 3])
    clock.now += step_s
    hooked.batch_ended()


def _data_free(hooked: HookedLoader, clock: Clock, *, wait_s: float, step_s: float) -> None:
    clock.now += wait_s
    started = hooked.moment()
    clock.now += step_s
    hooked.data_free_step(started)


def test_a_data_free_step_is_no_batch_and_its_time_is_set_aside():
    clock = Clock()
    hooked = _hooked(clock)
    hooked.epoch_started()
    _data_free(hooked, clock, wait_s=0.0, step_s=5.0)  # at the epoch's start: not its first batch's wait
    _real(hooked, clock, wait_s=0.1, step_s=0.02)
    _real(hooked, clock, wait_s=0.1, step_s=0.02)
    _data_free(hooked, clock, wait_s=0.03, step_s=5.0)  # a batch fetched ahead: its 0.03 s is the next one's
    _data_free(hooked, clock, wait_s=0.0, step_s=5.0)
    hooked.start_stretch()
    _real(hooked, clock, wait_s=0.07, step_s=0.02)
    _data_free(hooked, clock, wait_s=0.0, step_s=5.0)
    stretch = hooked.stretch()
    report = hooked.finish(history=False, main=False)

    assert report is not None
    rec = report.recording
    assert rec.epochs[0].batches == 3 and len(rec.batches) == 3
    assert [b.wait_s for b in rec.batches] == pytest.approx([0.1, 0.1, 0.1])
    assert [b.step_s for b in rec.batches] == pytest.approx([0.02] * 3)
    assert rec.epochs[0].first_batch_s == pytest.approx(0.1)
    assert wait_fraction(rec) == pytest.approx(0.3 / 0.36)
    assert stretch.batches == 1 and stretch.batches_per_s == pytest.approx(1 / 0.09)


def test_a_step_of_real_and_data_free_batches_records_the_real_ones_with_the_whole_wait():
    clock = Clock()
    hooked = _hooked(clock)
    hooked.epoch_started()
    clock.now += 0.3
    started = hooked.moment()
    clock.now += 0.4  # 4 batches stepped on, 3 of them handed again
    hooked.batches_stepped(1, started, data_free=3)
    clock.now += 0.2
    started = hooked.moment()
    clock.now += 0.2
    hooked.batches_stepped(0, started, data_free=2)  # a step of data-free batches alone
    clock.now += 0.1
    started = hooked.moment()
    clock.now += 0.1
    hooked.batches_stepped(1, started)
    report = hooked.finish(history=False, main=False)

    assert report is not None
    rec = report.recording
    assert [b.wait_s for b in rec.batches] == pytest.approx([0.3, 0.3])
    assert [b.step_s for b in rec.batches] == pytest.approx([0.1, 0.1])


def test_the_trainer_is_told_which_batches_were_handed_again_and_how_much_longer_an_epoch_is():
    loader = DataLoader(list(range(40)), batch_size=2)  # 20 batches
    ceiling = TrainerCeiling(loader, 9, stop_when_done=False)  # 6 batches, then real 5, free 3, ... real 5
    turns = ceiling.turns
    assert turns.start_after == 6
    assert ceiling.data_free_ahead(20) == 6  # free at deliveries 11-13 and 19-21 before the 20th real one
    proxy = TurnsLoader(loader, ceiling)
    assert isinstance(proxy, DataLoader) and proxy.batch_size == 2 and len(proxy) == 20

    kinds, real = [], []
    for batch in proxy:
        kinds.append(ceiling.stepped())
        if not kinds[-1]:
            real.append(batch.tolist())
    assert real == [batch.tolist() for batch in loader]  # every batch once, in order
    assert kinds.count(1) == 6 and len(kinds) == 26
    assert kinds[11:14] == [1, 1, 1] and kinds[19:22] == [1, 1, 1]
    assert turns.ceiling.data_free_steps == 6
    assert ceiling.data_free_ahead(20) == 3  # the third turn, in the next epoch
