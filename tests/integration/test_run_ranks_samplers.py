"""`loaderdoctor run --nproc-per-node 2` on a script whose loaders draw what their ranks train on: a loader with no
DistributedSampler (every rank shuffles the whole dataset alike) and a stream every rank reads whole are named by
distributed-sampler, from what each rank's first epoch drew; a loader with a DistributedSampler is not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(120)]

SCRIPT = """\
import os
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

class Numbered(Dataset):
    def __len__(self):
        return 96

    def __getitem__(self, index):
        return torch.tensor([index], dtype=torch.float32)

class Stream(IterableDataset):
    def __iter__(self):
        return (torch.tensor([i], dtype=torch.float32) for i in range(96))

torch.manual_seed(0)  # every rank alike, as most scripts seed
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
whole = DataLoader(Numbered(), batch_size=4, shuffle=True, num_workers=1)
split = DataLoader(Numbered(), batch_size=4, sampler=DistributedSampler(Numbered(), world, rank))
stream = DataLoader(Stream(), batch_size=4)
for loader in (whole, split, stream):
    for batch in loader:
        pass
print(f"rank {rank} done", flush=True)
"""


def test_ranks_that_train_on_the_same_samples_are_named_and_a_distributed_sampler_is_not(tmp_path: Path):
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    result = subprocess.run(
        [sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--nproc-per-node", "2", "--json", "out.json",
         "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr  # the script's own status
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout
    loaders = json.loads((tmp_path / "out.json").read_text())["loaders"]
    lines = {name: n for n, line in enumerate(SCRIPT.splitlines(), 1) for name in ("whole", "split", "stream")
             if line.startswith(f"{name} = DataLoader")}  # fmt: skip
    rules = {
        name: [f for f in loaders[f"train.py:{line}/rank0"]["findings"] if f["rule"] == "distributed-sampler"]
        for name, line in lines.items()
    }
    (whole,) = rules["whole"]
    assert whole["severity"] == "critical" and whole["evidence"]["shared_samples_share"] == 1.0
    assert whole["evidence"]["sampler"] == "RandomSampler" and whole["evidence"]["samples_per_rank"] == 96
    (stream,) = rules["stream"]
    assert stream["severity"] == "critical" and stream["evidence"]["iterable"] is True
    assert rules["split"] == []
    for line in lines.values():  # on the lowest rank's loader only
        assert not [f for f in loaders[f"train.py:{line}/rank1"]["findings"] if f["rule"] == "distributed-sampler"]
    assert "distributed-sampler" in result.stderr
