"""A worker cache that grows 1 MiB a sample, in epochs that last a fraction of a second: check names its growth
at the default budget and at 10 s, however few seconds the measurement takes (the workers' memory is read as
each epoch begins and as each window ends, not only as often as a round's cost allows)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import loaderdoctor

pytestmark = [pytest.mark.workers, pytest.mark.timeout(120)]


class Augmented(Dataset):
    """A cache keyed by (index, random crop) that never hits: 1 MiB more in the worker at every sample."""

    def __init__(self) -> None:
        self.cache: dict[tuple[int, float], np.ndarray] = {}

    def __len__(self) -> int:
        return 128

    def __getitem__(self, index: int) -> torch.Tensor:
        key = (index, random.random())
        self.cache.setdefault(key, np.ones(1 << 20, dtype=np.uint8))
        return torch.tensor([index], dtype=torch.float32)


@pytest.mark.parametrize("budget_s", [60.0, 10.0])
def test_a_cache_growing_a_mib_a_sample_is_named_however_short_the_epochs(budget_s):
    loader = DataLoader(Augmented(), batch_size=8, num_workers=2, persistent_workers=True)
    report = loaderdoctor.check(loader, budget_s=budget_s, verify_fix=False)
    (loader_report,) = report.loaders.values()
    assert sum(epoch.wall_s for epoch in loader_report.recording.epochs) < 5  # a short measurement
    findings = {f.rule: f for f in loader_report.findings}
    readings = [(round(r.t_s, 2), r.pid, r.uss_bytes) for r in loader_report.recording.worker_samples]
    assert "memory-growth" in findings, ([f.rule for f in loader_report.findings], readings)
    growth = findings["memory-growth"].evidence
    assert growth["growth_mb_per_worker"] >= 100, growth  # 192 MiB a worker over 3 epochs, from its first batch on
