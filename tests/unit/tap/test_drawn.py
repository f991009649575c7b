"""DrawnIndices on torch's own iterators: the indices a loader's sampler gives the iterator as it asks (without
workers all of them; with workers all but those drawn ahead while the iterator was made), a batch sampler's lists
flattened, at most the limit, and torch's own `_sampler_iter` back at the limit or at an index that is no
integer; watch() keeps the first epoch's in its Recording, with the sampler's class."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from loaderdoctor.tap.drawn import DrawnIndices
from loaderdoctor.tap.iterator import shutdown
from loaderdoctor.watch import watch


class Numbered(Dataset):
    def __len__(self) -> int:
        return 60

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


def _drawn(loader: DataLoader, limit: int = 1000) -> tuple[list[int], list[int]]:
    """What DrawnIndices noted of one epoch, and the indices the epoch delivered."""
    iterator = iter(loader)
    drawn = DrawnIndices.of(iterator, limit)
    assert drawn is not None
    noted, delivered = [], []
    try:
        for batch in iterator:
            noted.extend(drawn.take() or [])
            delivered.extend(batch.view(-1).tolist())
    finally:
        shutdown(loader, iterator)  # persistent workers too
    return noted, delivered


def test_without_workers_every_index_drawn_is_noted_in_order():
    noted, delivered = _drawn(DataLoader(Numbered(), batch_size=4, sampler=RandomSampler(Numbered())))
    assert noted == delivered and sorted(noted) == list(range(60))


def test_a_batch_samplers_lists_are_noted_index_by_index_up_to_the_limit():
    loader = DataLoader(Numbered(), batch_sampler=BatchSampler(RandomSampler(Numbered()), 7, drop_last=False))
    iterator = iter(loader)
    source = iterator._sampler_iter
    drawn = DrawnIndices.of(iterator, 10)
    batches = [next(iterator).view(-1).tolist() for _ in range(3)]
    assert drawn is not None and drawn.take() == (batches[0] + batches[1])[:10]
    assert iterator._sampler_iter is source  # torch's own again: nothing more is noted
    assert len([*batches, *iterator]) == 9


def test_an_index_that_is_no_integer_stops_the_noting():
    class Keyed(Dataset):
        def __getitem__(self, key: str) -> int:
            return len(key)

    loader = DataLoader(Keyed(), batch_size=2, sampler=["a", "bb", "ccc"])
    iterator = iter(loader)
    drawn = DrawnIndices.of(iterator, 100)
    assert [b.tolist() for b in iterator] == [[1, 2], [3]]
    assert drawn is not None and drawn.take() is None


def test_an_iterator_that_is_not_torchs_draws_nothing_to_note():
    assert DrawnIndices.of(iter([1, 2]), 100) is None
    assert DrawnIndices.of(iter(DataLoader(Numbered())), 0) is None


@pytest.mark.workers
@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_with_workers_the_indices_drawn_ahead_at_iter_go_unnoted(persistent):
    loader = DataLoader(Numbered(), batch_size=4, num_workers=2, prefetch_factor=2, shuffle=True,
                        persistent_workers=persistent, multiprocessing_context="fork")  # fmt: skip
    noted, delivered = _drawn(loader)
    assert sorted(delivered) == list(range(60))
    assert noted == delivered[2 * 2 * 4 :]  # 2 workers x prefetch 2 batches of 4, drawn while iter() made it


@pytest.mark.workers
@pytest.mark.timeout(60)
def test_a_watch_keeps_the_first_epochs_draws_and_its_sampler():
    loader = DataLoader(Numbered(), batch_size=4, num_workers=1, sampler=RandomSampler(Numbered()))
    watched = watch(loader, "drawn", history=False)
    first = []
    for epoch in range(2):
        for batch in watched:
            first.extend(batch.view(-1).tolist() if epoch == 0 else [])
    watched._run.log_diagnosis = False
    report = watched._run.close()
    assert report is not None
    rec = report.recording
    assert (rec.sampler, rec.sampler_distributed, rec.samples_per_epoch) == ("RandomSampler", False, 60)
    assert rec.drawn_indices == first[1 * 2 * 4 :]  # the first epoch's, less those drawn ahead at iter()
    assert rec.drawn_fingerprints == []  # a map-style dataset's samples are not fingerprinted
