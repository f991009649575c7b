"""loaderdoctor.ThreadLoader against torch's DataLoader: the same batches in the same order for DataLoader's arguments
(seeded shuffles included), DataLoader's errors for the same mistakes, and a sampler's epoch left to its user."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, SequentialSampler

import loaderdoctor
from loaderdoctor.errors import UsageError
from loaderdoctor.loader.threads import threads_available
from shared_datasets import Pairs, Stream

pytestmark = [
    pytest.mark.skipif(not threads_available(), reason="the thread backend needs torchdata"),
    pytest.mark.timeout(60),
]


class EpochSampler(Sampler[int]):
    """A sampler whose order depends on the epoch its user sets, as DistributedSampler's does."""

    def __init__(self, length: int) -> None:
        self.length, self.epoch = length, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        start = self.epoch % self.length
        return iter([*range(start, self.length), *range(start)])

    def __len__(self) -> int:
        return self.length


def _epochs(loader, epochs: int = 2) -> list[list]:
    """Each epoch's batches, as nested lists."""

    def plain(value):
        if isinstance(value, torch.Tensor):
            return value.tolist()
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return [[plain(batch) for batch in loader] for _ in range(epochs)]


def _both(**kwargs) -> tuple[list, list]:
    """Two epochs of DataLoader and of ThreadLoader built with the same arguments, each from the same seed."""
    torch.manual_seed(7)
    expected = _epochs(DataLoader(Pairs(23), **kwargs))
    torch.manual_seed(7)
    got = _epochs(loaderdoctor.ThreadLoader(Pairs(23), num_workers=3, **kwargs))
    return expected, got


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"batch_size": 4},
        {"batch_size": 4, "drop_last": True},
        {"batch_size": None},
        {"batch_size": 5, "shuffle": True},
        {"batch_size": None, "shuffle": True},
        {"batch_sampler": BatchSampler(SequentialSampler(range(23)), 6, drop_last=False)},
        {"sampler": [5, 3, 1, 22], "batch_size": 2},
        {"batch_size": 4, "collate_fn": lambda samples: [index for _, index in samples]},
    ],
    ids=[
        "defaults",
        "batched",
        "drop-last",
        "unbatched",
        "shuffled",
        "unbatched-shuffled",
        "batch-sampler",
        "sampler",
        "collate",
    ],
)
def test_the_batches_and_their_order_are_a_dataloaders(kwargs):
    expected, got = _both(**kwargs)
    assert got == expected
    assert len(loaderdoctor.ThreadLoader(Pairs(23), **kwargs)) == len(DataLoader(Pairs(23), **kwargs))


def test_a_generators_shuffle_gives_a_dataloaders_order_every_epoch():
    expected = _epochs(DataLoader(Pairs(23), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)), 3)
    loader = loaderdoctor.ThreadLoader(
        Pairs(23), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    got = _epochs(loader, 3)
    assert got == expected
    assert got[0] != got[1]  # a new order each epoch


def test_the_samplers_epoch_is_the_one_its_user_set():
    for batch_size in (None, 2):
        sampler = EpochSampler(6)
        loader = loaderdoctor.ThreadLoader(range(6), sampler=sampler, batch_size=batch_size, collate_fn=lambda s: s)
        orders = []
        for epoch in (1, 2):
            sampler.set_epoch(epoch)
            orders.append(list(loader))
        assert sampler.epoch == 2
        first = orders[0][0] if batch_size is None else orders[0][0][0]
        second = orders[1][0] if batch_size is None else orders[1][0][0]
        assert (first, second) == (1, 2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sampler": [0, 1], "shuffle": True},
        {"batch_sampler": [[0, 1]], "batch_size": 2},
        {"batch_sampler": [[0, 1]], "drop_last": True},
        {"batch_size": None, "drop_last": True},
    ],
    ids=["sampler-and-shuffle", "batch-sampler-and-size", "batch-sampler-and-drop-last", "unbatched-drop-last"],
)
def test_the_mistakes_dataloader_refuses_raise_its_error(kwargs):
    with pytest.raises(ValueError) as torch_error:
        DataLoader(Pairs(23), **kwargs)
    with pytest.raises(ValueError) as our_error:
        loaderdoctor.ThreadLoader(Pairs(23), **kwargs)
    assert str(our_error.value) == str(torch_error.value)


def test_what_threads_cannot_do_is_refused_saying_what_to_use():
    with pytest.raises(UsageError, match="map-style datasets only") as refused:
        loaderdoctor.ThreadLoader(Stream(4))
    assert "DataLoader" in refused.value.hint
    with pytest.raises(ValueError, match="num_workers=0"):
        loaderdoctor.ThreadLoader(Pairs(23), num_workers=0)
