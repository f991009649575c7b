"""check() leaves the user's loader as it found it: a seeded loader checked before training yields the same
batches as one never checked, and the generators and global random states it draws from are restored."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset

import loaderdoctor
from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.loader.workload import Workload
from loaderdoctor.probe.userstate import user_state_kept

SEED = 123
SAMPLES = 20
BUDGET_S = 2.0

pytestmark = pytest.mark.timeout(60)  # check may verify a fix with workers


def _dataset() -> TensorDataset:
    return TensorDataset(torch.arange(float(SAMPLES)))


def _seeded_by_loader() -> DataLoader:
    return DataLoader(_dataset(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(SEED))


def _seeded_by_sampler() -> DataLoader:
    dataset = _dataset()
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def _seeded_by_batch_sampler() -> DataLoader:
    dataset = _dataset()
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
    return DataLoader(dataset, batch_sampler=BatchSampler(sampler, batch_size=4, drop_last=False))


def _two_epochs(loader: DataLoader) -> list[list[float]]:
    return [batch[0].tolist() for _ in range(2) for batch in loader]


@pytest.mark.parametrize("make_loader", [_seeded_by_loader, _seeded_by_sampler, _seeded_by_batch_sampler])
def test_a_checked_loader_trains_on_the_batches_it_was_seeded_for(make_loader: Callable[[], DataLoader]) -> None:
    expected = _two_epochs(make_loader())
    loader = make_loader()
    loaderdoctor.check(loader, budget_s=BUDGET_S)
    assert _two_epochs(loader) == expected


def test_a_loader_without_a_generator_leaves_torchs_global_generator_as_it_was() -> None:
    torch.manual_seed(0)
    expected = _two_epochs(DataLoader(_dataset(), batch_size=4, shuffle=True))
    torch.manual_seed(0)
    loader = DataLoader(_dataset(), batch_size=4, shuffle=True)
    before = torch.get_rng_state()
    loaderdoctor.check(loader, budget_s=BUDGET_S)
    assert torch.equal(torch.get_rng_state(), before)
    assert _two_epochs(loader) == expected


class Augmented(Dataset):
    """Draws from python's, numpy's and torch's global random states for every sample, as augmentations do."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index + random.random() + float(np.random.rand()) + float(torch.rand(()))])


def test_samples_loaded_in_the_main_process_leave_the_global_random_states_as_they_were() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    before = _global_states()
    loaderdoctor.check(DataLoader(Augmented(), batch_size=4), budget_s=BUDGET_S)
    assert _same_states(_global_states(), before)


def test_the_states_are_restored_when_check_fails() -> None:
    def failing_step(batch: Any) -> None:
        raise ValueError("the step fails")

    loader = _seeded_by_loader()
    state = loader.generator.get_state()
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with pytest.raises(LoaderDoctorError, match="the step fails"):
        loaderdoctor.check(Workload(train=loader, step=failing_step), budget_s=BUDGET_S)
    assert torch.equal(loader.generator.get_state(), state)
    assert torch.equal(torch.get_rng_state(), before)


def test_user_state_kept_restores_the_generators_and_the_global_states_after_an_error() -> None:
    loader = _seeded_by_batch_sampler()
    generator = loader.batch_sampler.sampler.generator
    generator_state, global_states = generator.get_state(), _global_states()
    with pytest.raises(RuntimeError, match="inside"), user_state_kept([loader]):
        torch.randint(10, (5,), generator=generator)
        random.random()
        np.random.rand()
        torch.rand(())
        raise RuntimeError("inside")
    assert torch.equal(generator.get_state(), generator_state)
    assert _same_states(_global_states(), global_states)


def _global_states() -> tuple[torch.Tensor, Any, Any]:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _same_states(a: tuple[torch.Tensor, Any, Any], b: tuple[torch.Tensor, Any, Any]) -> bool:
    numpy_same = a[2][0] == b[2][0] and np.array_equal(a[2][1], b[2][1]) and a[2][2:] == b[2][2:]
    return torch.equal(a[0], b[0]) and a[1] == b[1] and numpy_same
