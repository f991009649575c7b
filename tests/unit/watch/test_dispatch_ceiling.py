"""DispatchedCeiling on a fake clock (accelerate's DataLoaderDispatcher under the Hugging Face callback's ceiling):
the main process's DataLoader hands the last real batch again for each fetch of a data-free step, one per process
for each of the dispatcher's batches, and the real stream goes on after; the turns, timed from the step hooks of a
dispatcher that fetches a batch ahead, measure each kind's own time; ceiling_only ends the run after the turns."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from loaderdoctor.tap.ceiling import CeilingMeasured
from loaderdoctor.watch.dispatchceiling import DispatchedCeiling


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _ceiling(per_step: int, clock: Clock | None = None, **options) -> DispatchedCeiling:
    # 9 data-free steps: after 6 of the dispatcher's batches, real turns of 5 and data-free turns of 3.
    loader = DataLoader(list(range(1000)), batch_size=None)
    return DispatchedCeiling(loader, 9, batches_per_step=per_step, stop_when_done=False, clock=clock or Clock(),
                             **options)  # fmt: skip


def test_the_main_process_hands_the_last_real_batch_again_for_every_fetch_of_a_data_free_step():
    ceiling = _ceiling(2)
    fetched = [batch for _, batch in zip(range(80), ceiling.iterator(iter(range(1000))), strict=False)]

    free = [step for step in range(40) if ceiling.turns.kind_at(step) == "data-free"]
    assert free == [11, 12, 13, 19, 20, 21, 27, 28, 29]
    expected, real = [], iter(range(1000))
    for step in range(40):
        for _ in range(2):
            expected.append(expected[-1] if step in free else next(real))
    assert fetched == expected  # both halves of a data-free step are the last real batch: nothing skipped after
    assert fetched[22:28] == [21] * 6


def _steps(ceiling: DispatchedCeiling, clock: Clock, steps: int, *, fetch_s: float, step_s: float) -> int:
    """The Trainer's hooks over `steps` steps of one batch, the dispatcher fetching a batch ahead (`fetch_s` for a
    real one, none for a data-free one): the batches stepped on that were data-free."""
    free = 0
    ceiling.epoch_started()
    for step in range(steps):
        ahead = [step, step + 1] if step == 0 else [step + 1]  # the fetches in the wait before this step
        clock.now += sum(fetch_s for n in ahead if ceiling.turns.kind_at(n) != "data-free")
        ceiling.step_started(1)
        clock.now += step_s
        free += ceiling.stepped(1)
    return free


def test_turns_timed_from_the_hooks_of_a_dispatcher_that_fetches_ahead_measure_each_kinds_own_time():
    clock = Clock()
    ceiling = _ceiling(2, clock)
    assert _steps(ceiling, clock, 60, fetch_s=0.010, step_s=0.002) == 9

    measured = ceiling.turns.ceiling
    assert measured.complete and measured.data_free_steps == 9
    assert measured.rate("real") == pytest.approx(1 / 0.012)
    assert measured.rate("data-free") == pytest.approx(1 / 0.002)  # no real fetch counted in a data-free turn
    assert measured.wait_estimate == pytest.approx(10 / 12)


def test_a_new_epoch_starts_from_the_batches_stepped_on_and_its_first_step_ends_no_interval():
    clock = Clock()
    ceiling = _ceiling(1, clock)
    _steps(ceiling, clock, 8, fetch_s=0.010, step_s=0.002)  # an epoch that ends before the turns begin
    assert ceiling.turns.step == 9  # with the fetch ahead that found its end counted, taken back at the next one's
    _steps(ceiling, clock, 40, fetch_s=0.010, step_s=0.002)
    assert ceiling.turns.ceiling.complete and ceiling.turns.ceiling.data_free_steps == 9
    assert ceiling.turns.ceiling.rate("real") == pytest.approx(1 / 0.012)


def test_ceiling_only_ends_the_run_once_the_turns_last_batch_was_stepped_on():
    clock = Clock()
    told = []
    loader = DataLoader(list(range(1000)), batch_size=None)
    ceiling = DispatchedCeiling(loader, 9, batches_per_step=1, stop_when_done=True, clock=clock,
                                on_measured=lambda: told.append(ceiling.stepped_batches))  # fmt: skip
    ceiling.epoch_started()
    for _ in range(ceiling.turns.end - 1):
        ceiling.step_started(1)
        ceiling.stepped(1)
        ceiling.end_if_measured()
    ceiling.step_started(1)
    ceiling.stepped(1)
    with pytest.raises(CeilingMeasured):
        ceiling.end_if_measured()
    assert ceiling.turns.end == 6 + 4 * 5 + 9 and told == [35]
