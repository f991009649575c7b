"""patch() with a real worker: a DataLoader made through torch.utils.data.DataLoader is guarded, delivers what the
plain one delivers, and ends its worker when closed."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data
from torch.utils.data.dataloader import DataLoader as TorchDataLoader

from loaderdoctor.guard import GuardedLoader
from loaderdoctor.guard.patch import patched, unpatch
from shared_datasets import Indices

pytestmark = [pytest.mark.workers, pytest.mark.timeout(60)]


def _arguments() -> tuple[tuple, dict]:
    return (Indices(40),), {
        "batch_size": 4,
        "shuffle": True,
        "num_workers": 1,
        "generator": torch.Generator().manual_seed(7),
    }


def test_a_patched_loader_with_a_worker_delivers_what_the_plain_one_does():
    args, kwargs = _arguments()
    plain = TorchDataLoader(*args, **kwargs)
    expected = [[batch.tolist() for batch in plain] for _ in range(2)]
    args, kwargs = _arguments()
    try:
        with patched(max_restarts=1), torch.utils.data.DataLoader(*args, **kwargs) as guarded:
            assert type(guarded) is GuardedLoader and guarded.settings.persistent_workers
            got = [[batch.tolist() for batch in guarded] for _ in range(2)]
            assert guarded.events[0].kind == "setting-changed" and guarded.restarts == 0
    finally:
        unpatch()
    assert got == expected
    assert torch.utils.data.DataLoader is TorchDataLoader
