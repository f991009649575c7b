"""Data-free turns (tap/ceiling.py) through the tap, in this process (no workers): the real stream goes on where it
stopped, every sample once and in order; the turns' times are the loop's, from one delivery to the next."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import torch
from simulated_device import SimulatedDevice
from torch.utils.data import DataLoader, IterableDataset

from loaderdoctor.host.accelerator import wait_for_devices
from loaderdoctor.plain.data import dataclass_from_dict
from loaderdoctor.tap.ceiling import (
    DEFAULT_STEPS,
    Ceiling,
    CeilingMeasured,
    CeilingTurns,
    Turn,
    turn_plan,
)
from loaderdoctor.tap.events import BatchDelivered, DataFreeBatch
from loaderdoctor.tap.iterator import Tap
from loaderdoctor.tap.turnsiterator import TurnsIterator


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Counting(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def _tapped(loader: DataLoader, steps: int | None, start_after: int = 3) -> tuple[Tap, list]:
    events: list = []
    tap = Tap(loader, [events.append], start_method=None)
    tap.ceiling = CeilingTurns(turn_plan(steps, num_workers=0, prefetch_factor=None), start_after)
    return tap, events


def _loop(tap: Tap, epochs: int) -> list[torch.Tensor]:
    seen = []
    for epoch in range(epochs):
        for batch in tap.epoch(epoch):
            seen.append(batch)
    return seen


def _real_stream(seen: list[torch.Tensor]) -> list[int]:
    """What the loader delivered: the loop's batches less each one handed again (the same object once more)."""
    kept = [batch for n, batch in enumerate(seen) if n == 0 or batch is not seen[n - 1]]
    return [int(v) for batch in kept for v in batch]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_map_style_stream_under_data_free_turns_is_the_stream_without_them(shuffle):
    def loader() -> DataLoader:
        generator = torch.Generator().manual_seed(7)
        return DataLoader(range(240), batch_size=4, shuffle=shuffle, generator=generator)

    once = loader()
    plain = [int(v) for epoch in range(2) for batch in once for v in batch]
    tap, events = _tapped(loader(), steps=30)
    seen = _loop(tap, epochs=2)
    assert _real_stream(seen) == plain  # every sample once, in the order the seeded sampler gives
    ceiling = tap.ceiling.ceiling
    assert ceiling.data_free_steps == 30 == len(seen) - len(plain) // 4
    assert sum(isinstance(e, DataFreeBatch) for e in events) == 30
    assert sum(isinstance(e, BatchDelivered) for e in events) == 120  # the loader's batches only


def test_an_iterable_stream_under_data_free_turns_is_the_stream_without_them():
    plain = [int(v) for batch in DataLoader(Counting(600), batch_size=5) for v in batch]
    tap, _ = _tapped(DataLoader(Counting(600), batch_size=5), steps=None)
    seen = _loop(tap, epochs=1)
    assert _real_stream(seen) == plain
    assert tap.ceiling.ceiling.data_free_steps == DEFAULT_STEPS


def test_the_turns_alternate_and_a_data_free_turn_hands_the_last_real_batch_again():
    tap, _ = _tapped(DataLoader(range(400), batch_size=2), steps=15, start_after=2)
    seen = _loop(tap, epochs=1)
    turn = tap.ceiling.ceiling.turns[1].deliveries
    assert turn == 5 and tap.ceiling.ceiling.turns[0].deliveries == 5  # no workers: nothing to refill
    # two warm-up deliveries, a real turn, then a data-free one: five times the batch the real turn ended with
    first_free = 2 + turn
    assert all(batch is seen[first_free - 1] for batch in seen[first_free : first_free + turn])
    # then the loader again, where it was: the batch after the one handed again
    assert [int(v) for v in seen[first_free + turn]] == [int(v) + 2 for v in seen[first_free - 1]]
    assert _real_stream(seen) == list(range(400))


def test_each_turn_is_timed_from_delivery_to_delivery_within_an_epoch():
    clock = FakeClock()
    ceiling = Ceiling(data_free_steps=0, refill=0, turns=[Turn("real", 4), Turn("data-free", 4), Turn("real", 4)])
    turns = CeilingTurns(ceiling, start_after=1)
    batch = object()
    for step in range(1 + 3 * 4):
        replay = turns.replay()
        kind = "data-free" if replay is not None else "real"
        clock.now += 0.01 if kind == "data-free" else 0.04  # a 10 ms step, and 30 ms of waiting for real data
        turns.delivered(
            0, replay if replay is not None else batch, 0.0 if replay else 0.03, clock.now, data_free=replay is not None
        )
        if step == 0:
            assert replay is None  # the warm-up
    real, free, real_again = ceiling.turns
    assert (real.intervals, free.intervals, real_again.intervals) == (4, 4, 4)
    assert ceiling.rate("real") == pytest.approx(25.0) and ceiling.rate("data-free") == pytest.approx(100.0)
    assert real.wait_s == pytest.approx(0.12) and free.wait_s == 0.0
    assert ceiling.pair_speedups() == pytest.approx([4.0])
    assert ceiling.data_free_steps == 4 and ceiling.complete
    assert turns.replay() is None  # past the plan: the loader's turn for good, its batch let go
    assert turns._last_batch is None


def test_a_turn_after_another_leaves_out_its_first_deliveries_while_the_workers_settle():
    # a real turn: the batches the workers had ready come at once; a data-free one: the workers still fill their
    # queue, taking CPU from the step (at most half the turn is left out)
    ceiling = Ceiling(
        data_free_steps=0,
        refill=2,
        turns=[Turn("real", 6), Turn("data-free", 6), Turn("real", 6), Turn("data-free", 3)],
    )
    turns = CeilingTurns(ceiling, start_after=1)
    now = 0.0
    for _ in range(1 + 6 + 6 + 6 + 3):
        replay = turns.replay()
        now += 0.01
        turns.delivered(0, replay or "batch", 0.0, now, data_free=replay is not None)
    assert [t.intervals for t in ceiling.turns] == [6, 4, 4, 2]


def test_no_interval_runs_across_an_epochs_end():
    ceiling = Ceiling(data_free_steps=0, refill=0, turns=[Turn("real", 10)])
    turns = CeilingTurns(ceiling, start_after=0)
    for n, epoch in zip(range(10), itertools.chain([0] * 5, [1] * 5), strict=True):
        if n == 5:
            turns.left_epoch()
        turns.delivered(epoch, "batch", 0.0, n * (10.0 if n == 5 else 1.0), data_free=False)
    assert ceiling.turns[0].intervals == 8  # the first of each epoch starts the clock


def test_a_ceiling_loads_back_from_its_json():
    ceiling = turn_plan(30, num_workers=2, prefetch_factor=2)
    ceiling.turns[0].intervals, ceiling.turns[0].seconds = 3, 0.5
    assert dataclass_from_dict(Ceiling, json.loads(json.dumps(dataclasses.asdict(ceiling)))) == ceiling
    assert ceiling.refill == 4
    assert [(t.kind, t.deliveries) for t in ceiling.turns] == [("real", 14), ("data-free", 10)] * 3 + [("real", 14)]
    uneven = turn_plan(16, num_workers=0, prefetch_factor=None)  # the steps asked for, shared out exactly
    assert [t.deliveries for t in uneven.turns if t.kind == "data-free"] == [6, 5, 5]


def test_turns_around_any_iterator_hand_the_last_batch_again_and_time_the_real_ones():
    clock = FakeClock()
    ceiling = Ceiling(data_free_steps=0, refill=0, turns=[Turn("real", 2), Turn("data-free", 2), Turn("real", 2)])
    told: list[int] = []

    def batches():
        for n in range(8):
            clock.now += 0.5  # each real batch waits half a second
            yield n

    turns = CeilingTurns(ceiling, start_after=1)
    seen = list(TurnsIterator(batches(), turns, 0, on_data_free=lambda: told.append(1), clock=clock))
    assert seen == [0, 1, 2, 2, 2, 3, 4, 5, 6, 7]  # after a real turn (1, 2), 2 twice, then on from 3
    assert len(told) == 2 == ceiling.data_free_steps
    assert ceiling.turns[0].wait_s == pytest.approx(1.0)  # both real intervals' waits, measured around next()
    assert ceiling.turns[1].seconds == 0.0 and ceiling.turns[1].intervals == 2  # no time passed in the data-free


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_guarded_loader_watched_with_a_ceiling_delivers_every_sample_once_in_order(shuffle):
    """The turns run outside the guard: its batch plan (and so its checkpoints and restarts) counts real batches
    only, and the stream goes on where it stopped."""
    from loaderdoctor import guard, watch

    def loader() -> DataLoader:
        return DataLoader(range(240), batch_size=4, shuffle=shuffle, generator=torch.Generator().manual_seed(7))

    once = loader()
    plain = [int(v) for epoch in range(2) for batch in once for v in batch]
    guarded = guard(loader())
    with watch(guarded, "guarded-ceiling", history=False, log_every_s=3600, ceiling=30) as watched:
        seen = [batch for epoch in range(2) for batch in watched]
    assert _real_stream(seen) == plain
    assert len(seen) == len(plain) // 4 + 30
    report = watched.report
    ceiling = report.recording.ceiling
    assert ceiling is not None and ceiling.data_free_steps == 30 and ceiling.complete
    assert report.recording.batches_delivered in (None, 120) and len(report.recording.batches) == 120


def test_on_an_asynchronous_device_each_turn_holds_its_own_steps_work():
    """The loop launches a step's work (10 ms of the device's time) in 1 ms and goes on: without waiting for the
    device at a turn's edges, a data-free turn of 4 steps would read 4 ms and leave its work to the real turn after."""
    device = SimulatedDevice()
    ceiling = Ceiling(data_free_steps=0, refill=0, turns=[Turn("real", 4), Turn("data-free", 4), Turn("real", 4)])
    turns = CeilingTurns(ceiling, start_after=1, wait_for_device=device.wait, clock=device.clock)
    for _ in range(1 + 3 * 4):
        replay = turns.replay()
        wait_s = 0.0 if replay is not None else 0.03  # real data takes 30 ms to come; the device works meanwhile
        device.now += wait_s
        turns.delivered(0, replay or "batch", wait_s, device.clock(), data_free=replay is not None)
        device.launch(cpu_s=0.001, device_s=0.010)
    assert device.waits == 4  # where the first turn's span begins, and at each turn's end
    # the device's 10 ms a step (and the 1 ms before its first), not the loop's 1 ms: 1000 a second
    assert ceiling.rate("data-free") == pytest.approx(4 / 0.041)
    assert ceiling.rate("real") == pytest.approx(1 / 0.031, rel=0.02)
    assert ceiling.speedup == pytest.approx(3.1, rel=0.05)


def test_without_an_initialized_device_nothing_is_waited_for_and_cuda_stays_uninitialized():
    assert wait_for_devices() is False
    assert not torch.cuda.is_initialized()  # a fork after it stays safe


class _Epoch:
    """An epoch's iterator whose length is known (as a DataLoader iterator's is)."""

    def __init__(self, n: int) -> None:
        self.batches, self.n = iter(range(n)), n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return self

    def __next__(self) -> int:
        return next(self.batches)


@pytest.mark.parametrize("length_known", [True, False])
def test_on_an_asynchronous_device_a_turn_across_an_epochs_end_holds_its_steps_work(length_known):
    """A compute-bound loop (the device's 10 ms a step, launched in 1 ms): a real turn that an epoch's end cuts in
    two reads the device's rate, not the launches' (the epoch's last batch, where its length is known, or the ask
    that found the epoch over, is where its work is waited for)."""
    device = SimulatedDevice()
    ceiling = Ceiling(data_free_steps=0, refill=0, turns=[Turn("real", 6), Turn("data-free", 4), Turn("real", 6)])
    turns = CeilingTurns(ceiling, start_after=1, wait_for_device=device.wait, clock=device.clock)
    for epoch in range(2):  # 8 real batches each: the second real turn runs across the first epoch's end
        inner = _Epoch(8) if length_known else iter(range(8))
        for _ in TurnsIterator(inner, turns, epoch, clock=device.clock):
            device.launch(cpu_s=0.001, device_s=0.010)
    rates = [turn.intervals / turn.seconds for turn in ceiling.turns]
    assert rates == pytest.approx([100.0] * 3, rel=0.1)  # without the waits at the epoch's end, 122 in the last
    assert ceiling.speedup == pytest.approx(1.0, rel=0.1)


def test_past_the_turns_a_script_exits_with_status_0_when_it_stops_there():
    ceiling = Ceiling(data_free_steps=0, refill=0, turns=[Turn("real", 2), Turn("data-free", 2), Turn("real", 2)])
    turns = CeilingTurns(ceiling, start_after=0, stop_when_done=True)
    seen = []
    with pytest.raises(SystemExit) as stopped:
        for batch in TurnsIterator(iter(range(100)), turns, 0):
            seen.append(batch)
    assert stopped.value.code == 0 and isinstance(stopped.value, CeilingMeasured)
    assert seen == [0, 1, 1, 1, 2, 3]  # the turns, then the end


@pytest.fixture
def one_cycle():
    """OneCycleLRs, alive in this process while the test runs, each brought to its end afterwards: one left alive
    and unfinished would make the turns of later tests in this process keep their epochs' length."""
    made: list[torch.optim.lr_scheduler.OneCycleLR] = []

    def make(total_steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        made.append(torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total_steps))
        return made[-1]

    yield make
    for schedule in made:
        schedule.last_epoch = schedule.total_steps


def test_with_a_schedule_that_raises_past_its_steps_an_epoch_keeps_its_length(caplog, one_cycle):
    """A OneCycleLR sized for the loop's 2 x 60 steps would raise at the 121st: each epoch that took data-free steps
    ends at its length, its last real batches left unasked (the turns here run across the first epoch's end)."""

    def loader() -> DataLoader:
        # no shuffle: a sampler left within its epoch draws the next epoch's order from another state of its generator
        return DataLoader(range(240), batch_size=4)

    plain = [list(range(240)) for epoch in range(2)]
    schedule = one_cycle(total_steps=120)
    events: list = []
    tap = Tap(loader(), [events.append], start_method=None)
    tap.ceiling = CeilingTurns(turn_plan(30, num_workers=0, prefetch_factor=None), 3, check_schedules=True)
    with caplog.at_level("WARNING", logger="loaderdoctor"):
        seen = [list(tap.epoch(epoch)) for epoch in range(2)]
    for _ in itertools.chain(*seen):
        schedule.optimizer.step()
        schedule.step()  # as the loop would: no step past the 120 planned
    assert [len(epoch) for epoch in seen] == [60, 60]
    assert tap.ceiling.ceiling.data_free_steps == 30 and tap.ceiling.ceiling.complete
    # 3 + 10 real, 10 data-free, 10 real, 10 data-free, 10 real, then 7 data-free in the first epoch, 3 in the second
    delivered = [sum(isinstance(e, BatchDelivered) and e.epoch == n for e in events) for n in range(2)]
    assert delivered == [60 - 27, 60 - 3]
    real = _real_stream(seen[0] + seen[1])
    assert real == plain[0][: 4 * delivered[0]] + plain[1][: 4 * delivered[1]]  # each epoch's first, in order
    assert "OneCycleLR is sized for 120 steps and raises past them" in caplog.text
    assert tap.ceiling.ceiling.kept_length == "the loop's OneCycleLR is sized for 120 steps and raises past them"
    assert sum(type(e).__name__ == "EpochEnded" for e in events) == 2


def test_a_schedule_at_its_end_leaves_the_stream_whole(one_cycle):
    finished = one_cycle(total_steps=2)
    for _ in range(2):
        finished.optimizer.step()
        finished.step()  # a training that ended (a notebook's earlier cell): it raises nothing more
    tap, _ = _tapped(DataLoader(range(240), batch_size=4), steps=30)
    tap.ceiling.check_schedules = True
    seen = _loop(tap, epochs=1)
    assert len(seen) == 60 + 30 and _real_stream(seen) == list(range(240))
    assert tap.ceiling.ceiling.kept_length is None


def test_a_run_that_stops_after_the_turns_does_not_look_for_schedules(one_cycle):
    one_cycle(total_steps=60)  # alive and unfinished, but the run ends once measured: it is never stepped past
    tap, _ = _tapped(DataLoader(range(240), batch_size=4), steps=15)
    tap.ceiling = CeilingTurns(turn_plan(15, num_workers=0, prefetch_factor=None), 3, check_schedules=True,
                               stop_when_done=True)  # fmt: skip
    with pytest.raises(SystemExit):
        _loop(tap, epochs=1)
    assert not tap.ceiling.keep_length and tap.ceiling.ceiling.kept_length is None


def test_an_epoch_of_unknown_length_cannot_keep_it_and_says_so(caplog, one_cycle):
    one_cycle(total_steps=100)
    plain = [int(v) for batch in DataLoader(Counting(400), batch_size=5) for v in batch]
    tap, _ = _tapped(DataLoader(Counting(400), batch_size=5), steps=15)
    tap.ceiling.check_schedules = True
    with caplog.at_level("WARNING", logger="loaderdoctor"):
        seen = _loop(tap, epochs=1)
    assert len(seen) == 80 + 15 and _real_stream(seen) == plain  # the steps added, the stream whole
    assert "but the loader's epochs have no known length to keep" in caplog.text
    assert caplog.text.count("no known length") == 1
    assert tap.ceiling.ceiling.kept_length is None  # the JSON says no epoch kept its length


def test_turns_around_any_iterator_end_an_epoch_that_keeps_its_length_at_its_length():
    ceiling = Ceiling(data_free_steps=0, refill=0, turns=[Turn("real", 2), Turn("data-free", 3), Turn("real", 2)])
    turns = CeilingTurns(ceiling, start_after=1)
    turns.keep_length = True
    seen = list(TurnsIterator(_Epoch(10), turns, 0))
    assert seen == [0, 1, 2, 2, 2, 2, 3, 4, 5, 6]  # ten steps: 3 data-free, 7 real, the last 3 left unasked
