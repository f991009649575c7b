"""The batch plan holds the batches a plain DataLoader delivers with the same seed, drawn as they are asked for,
and replays any suffix not yet delivered."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, SequentialSampler

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.batchplan import EpochPlan, PlannedBatchSampler, check_resumable, start_epoch
from shared_datasets import Stream


class _ResumableStream(Stream):
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _plain_epochs(make, epochs: int) -> list[list]:
    loader = make()
    return [[b.tolist() for b in loader] for _ in range(epochs)]


def _batches(plan: EpochPlan) -> list:
    return [batch for _, batch in plan.batches_from(0)]


def _listed(batches: list) -> EpochPlan:
    return EpochPlan(iter(batches), length=len(batches))


def _plan_epochs(make, epochs: int) -> list[list]:
    loader = make()
    return [[list(b) for b in _batches(start_epoch(loader, draws_base_seed=True))] for _ in range(epochs)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_shuffled_plan_is_the_plain_loaders_order_epoch_after_epoch(drop_last):
    def make() -> DataLoader:
        generator = torch.Generator().manual_seed(7)
        return DataLoader(list(range(23)), batch_size=4, shuffle=True, drop_last=drop_last, generator=generator)

    assert _plan_epochs(make, 3) == _plain_epochs(make, 3)


def test_without_a_generator_the_plan_follows_the_global_seed():
    def make() -> DataLoader:
        torch.manual_seed(11)
        return DataLoader(list(range(10)), batch_size=3, shuffle=True)

    assert _plan_epochs(make, 2) == _plain_epochs(make, 2)


def test_skipping_the_base_seed_draw_is_what_persistent_workers_do_after_the_first_epoch():
    loader = DataLoader(list(range(10)), batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(3))
    plan = start_epoch(loader, draws_base_seed=False)
    again = torch.Generator().manual_seed(3)
    expected = torch.randperm(10, generator=again).tolist()
    assert plan.seed_state is None
    assert [i for batch in _batches(plan) for i in batch] == expected


def test_the_seed_state_replays_the_plain_loaders_base_seed():
    generator = torch.Generator().manual_seed(5)
    loader = DataLoader(list(range(6)), batch_size=2, shuffle=True, generator=generator)
    plan = start_epoch(loader, draws_base_seed=True)
    copy = torch.Generator().set_state(plan.seed_state)
    expected = torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(5)).item()
    assert torch.empty((), dtype=torch.int64).random_(generator=copy).item() == expected


def test_a_batch_sampler_of_the_users_own_is_planned_as_it_yields():
    sampler = BatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=False)
    loader = DataLoader(list(range(7)), batch_sampler=sampler)
    assert _batches(start_epoch(loader, draws_base_seed=True)) == [[0, 1, 2], [3, 4, 5], [6]]


def test_without_auto_collation_the_plan_holds_single_indices():
    def make() -> DataLoader:
        return DataLoader(list(range(5)), batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(1))

    expected = [int(x) for x in make()]
    assert _batches(start_epoch(make(), draws_base_seed=True)) == expected


def test_the_planned_sampler_yields_the_batches_from_start_on():
    sampler = PlannedBatchSampler(_listed([[0, 1], [2, 3], [4, 5]]), 1)
    assert list(sampler) == [[2, 3], [4, 5]]
    assert len(sampler) == 2
    sampler.replan(_listed([[9]]), 0)
    assert list(sampler) == [[9]] and len(sampler) == 1
    assert list(PlannedBatchSampler(_listed([[0, 1], [2, 3], [4, 5]]), 3)) == []


def test_an_iteration_under_way_keeps_its_plan():
    sampler = PlannedBatchSampler(_listed([[0], [1], [2]]))
    iterator = iter(sampler)
    assert next(iterator) == [0]
    sampler.replan(_listed([[7], [8]]), 0)
    assert list(iterator) == [[1], [2]]


@pytest.mark.parametrize("start", [-1, 4])
def test_a_start_outside_the_plan_is_refused(start):
    with pytest.raises(ValueError, match="outside a plan of 3 batches"):
        PlannedBatchSampler().replan(_listed([[0], [1], [2]]), start)


def test_a_planned_sampler_drives_a_dataloader():
    loader = DataLoader(list(range(10, 20)), batch_sampler=PlannedBatchSampler(_listed([[0, 1], [5], [9, 8]]), 1))
    assert [b.tolist() for b in loader] == [[15], [19, 18]]


def test_an_iterable_dataset_without_state_dict_is_refused_with_a_reason():
    with pytest.raises(UsageError, match="cannot resume the IterableDataset Stream: without state_dict") as raised:
        check_resumable(DataLoader(Stream(5), batch_size=2))
    assert "give it state_dict()" in raised.value.hint


def test_a_resumable_iterable_dataset_has_no_plan_but_draws_the_seed_as_the_plain_loader():
    def make() -> DataLoader:
        return DataLoader(_ResumableStream(5), batch_size=2, generator=torch.Generator().manual_seed(3))

    check_resumable(make())
    loader = make()
    first, second = (start_epoch(loader, draws_base_seed=True) for _ in range(2))
    assert _batches(first) == _batches(second) == []  # its sampler never ends: the dataset ends the epoch
    plain = make()
    states = []
    for _ in range(2):
        states.append(plain.generator.get_state())
        list(plain)
    assert torch.equal(first.seed_state, states[0]) and torch.equal(second.seed_state, states[1])


class _Forever(Sampler):
    """An endless sampler, as detectron2's TrainingSampler: no len(), never ends."""

    def __init__(self) -> None:
        self.drawn = 0

    def __iter__(self):
        while True:
            self.drawn += 1
            yield self.drawn % 7


def test_an_endless_sampler_is_drawn_only_as_far_as_asked():
    sampler = _Forever()
    plan = start_epoch(DataLoader(list(range(7)), batch_size=2, sampler=sampler), draws_base_seed=True)
    assert plan.length is None and sampler.drawn == 0
    assert plan.batch(2) == [5, 6] and sampler.drawn == 6
    with pytest.raises(TypeError, match="no len"):
        len(PlannedBatchSampler(plan))


def test_a_plan_keeps_only_the_batches_drawn_and_not_delivered():
    loader = DataLoader(range(10**12), batch_size=4)  # a sequential sampler over 10^12 samples
    plan = start_epoch(loader, draws_base_seed=True)
    assert plan.length == 250_000_000_000
    assert plan.batch(3) == [12, 13, 14, 15] and plan.kept() == 4
    assert plan.delivered(1) == [4, 5, 6, 7] and plan.kept() == 2
    assert [batch for _, batch in zip(range(2), plan.batches_from(2), strict=False)] == [
        (2, [8, 9, 10, 11]),
        (3, [12, 13, 14, 15]),
    ]
    with pytest.raises(IndexError):
        plan.batch(0)  # delivered: gone


def test_skipping_past_the_epochs_end_is_a_usage_error():
    with pytest.raises(UsageError, match="position 5 is past the end of the epoch, which has 3 batches"):
        _listed([[0], [1], [2]]).skip(5)
