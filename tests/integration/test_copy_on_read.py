"""Copy-on-read under fork (pytorch#13246) with real workers: a dataset's list of Python strings, read by each
worker, is copied into every one of them, and check names it though the copy levels off early in the run."""

from __future__ import annotations

import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import loaderdoctor

pytestmark = [pytest.mark.workers, pytest.mark.timeout(90)]

STRINGS = 1_000_000  # of 100 characters: about 150 MB of str objects, built in well under 2 s
SAMPLES = 256
# Each worker reads the next 1/128 of the list per sample, so that it has read all of it after one epoch's
# share of samples (128 of 256, with 2 workers): the copy grows over the first epoch and stays flat after.
CHUNK = STRINGS // 128
MIB = 2**20


class StringPaths(Dataset):
    """File paths kept as a list of str, as many datasets do: reading one takes a reference to it, which writes
    its reference count and so copies its page into the forked worker that reads it."""

    def __init__(self) -> None:
        self.paths = [f"{i:0100d}" for i in range(STRINGS)]
        self.cursor = 0  # each worker has its own (a copy of the dataset), so each reads the whole list

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        start = self.cursor % STRINGS
        self.cursor += CHUNK
        characters = sum(map(len, self.paths[start : start + CHUNK]))
        time.sleep(0.01)  # the rest of a sample's work: spreads the copy over the epoch
        return torch.tensor([index, characters])


def test_copy_on_read_of_a_list_of_strings_is_named():
    dataset = StringPaths()
    data_mb = STRINGS * sys.getsizeof(dataset.paths[0]) / MIB
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    report = loaderdoctor.check(loader, budget_s=6, verify_fix=False)
    (loader_report,) = report.loaders.values()
    findings = {f.rule: f for f in loader_report.findings}
    assert "memory-growth" in findings, [f.title for f in loader_report.findings]
    growth = findings["memory-growth"]
    # Most of the strings' pages were copied into each worker after its first batch.
    assert growth.evidence["growth_mb_per_worker"] > data_mb / 2
    assert growth.evidence["total_mb"] >= 2 * growth.evidence["growth_mb_per_worker"] - 0.1
    assert "13246" in growth.fix
    if not growth.evidence["still_rising"]:
        assert "leak" not in (growth.title + growth.fix).lower()
