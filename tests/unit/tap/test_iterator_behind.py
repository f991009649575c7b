"""A loader whose own __iter__ is a generator around torch's (litdata's StreamingDataLoader does so) hands the tap
no iterator with workers: the tap finds torch's behind it at the first next(), tells its workers, and leaves
nothing on the loader."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from loaderdoctor.tap.events import IteratorCreated, WorkersStarted
from loaderdoctor.tap.iterator import Tap


class Generating(DataLoader):
    def __iter__(self):
        yield from super().__iter__()


@pytest.mark.workers
@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_the_workers_behind_a_loaders_own_generator_are_found_and_told(persistent):
    events = []
    loader = Generating(torch.arange(32.0), batch_size=4, num_workers=2, persistent_workers=persistent)
    tap = Tap(loader, [events.append], start_method="fork")
    try:
        for epoch in range(2):
            assert len(list(tap.epoch(epoch))) == 8
            assert "_get_iterator" not in vars(loader)  # the loader as it was
    finally:
        if loader._iterator is not None:
            loader._iterator._shutdown_workers()
    created = [e.worker_pids for e in events if isinstance(e, IteratorCreated)]
    started = [e.worker_pids for e in events if isinstance(e, WorkersStarted)]
    assert created[0] == []  # a generator: no workers yet at iter()
    assert len(started[0]) == 2
    if persistent:  # started once, found again through the loader's own iterator
        assert started == [started[0]] and created[1] == started[0]
    else:  # started every epoch, found each time
        assert created == [[], []] and len(started) == 2 and started[0] != started[1]


@pytest.mark.workers
@pytest.mark.timeout(60)
def test_torchs_own_loader_needs_no_finding():
    events = []
    loader = DataLoader(torch.arange(16.0), batch_size=4, num_workers=2)
    tap = Tap(loader, [events.append], start_method="fork")
    list(tap.epoch(0))
    assert not [e for e in events if isinstance(e, WorkersStarted)]
    assert [len(e.worker_pids) for e in events if isinstance(e, IteratorCreated)] == [2]
    assert "_get_iterator" not in vars(loader)


@pytest.mark.workers
@pytest.mark.timeout(60)
def test_an_epoch_given_up_before_its_first_batch_leaves_the_next_one_its_workers():
    events = []
    loader = Generating(torch.arange(16.0), batch_size=4, num_workers=2)
    tap = Tap(loader, [events.append], start_method="fork")
    abandoned = tap.epoch(0)  # iter() only: the generator made nothing yet, and noting stays on the loader
    assert "_get_iterator" in vars(loader)
    del abandoned
    assert len(list(tap.epoch(1))) == 4
    assert [len(e.worker_pids) for e in events if isinstance(e, WorkersStarted)] == [2]
    assert "_get_iterator" not in vars(loader)
