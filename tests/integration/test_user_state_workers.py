"""tune() and check() with real workers leave the user's loader as they found it: a seeded loader tuned or checked
before training yields the same batches as one never touched."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import loaderdoctor

pytestmark = [pytest.mark.workers, pytest.mark.timeout(120)]

SEED = 123


def _seeded(num_workers: int = 0) -> DataLoader:
    dataset = TensorDataset(torch.arange(20.0))
    generator = torch.Generator().manual_seed(SEED)
    return DataLoader(dataset, batch_size=4, shuffle=True, generator=generator, num_workers=num_workers)


def _two_epochs(loader: DataLoader) -> list[list[float]]:
    return [batch[0].tolist() for _ in range(2) for batch in loader]


def test_a_tuned_loader_trains_on_the_batches_it_was_seeded_for() -> None:
    expected = _two_epochs(_seeded())
    loader = _seeded()
    torch.manual_seed(0)
    before = torch.get_rng_state()
    loaderdoctor.tune(loader, budget_s=5.0, quick=True, max_workers=1)
    assert torch.equal(torch.get_rng_state(), before)
    assert _two_epochs(loader) == expected


def test_a_loader_with_workers_checked_trains_on_the_batches_it_was_seeded_for() -> None:
    expected = _two_epochs(_seeded(num_workers=1))
    loader = _seeded(num_workers=1)
    loaderdoctor.check(loader, budget_s=2.0)
    assert _two_epochs(loader) == expected
