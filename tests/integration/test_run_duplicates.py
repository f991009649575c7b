"""`loaderdoctor run` on a training script over a stream that its 2 workers each read whole: duplicate-samples is
named, as `check` names it; the same stream split across the workers by get_worker_info() is not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(120)]

SCRIPT = """\
import time
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

class Shards(IterableDataset):  # 128 samples; split=False: every worker reads all of them, as unsplit shards do
    def __init__(self, split):
        self.split = split

    def __iter__(self):
        info = get_worker_info()
        items = range(128)
        if self.split and info is not None:
            items = items[info.id :: info.num_workers]
        for i in items:
            yield torch.full((8,), float(i))

def train(loader, label):
    for epoch in range(2):
        samples = 0
        for batch in loader:
            samples += batch.shape[0]
            time.sleep(0.001)
        print(label, samples)

train(DataLoader(Shards(split=False), batch_size=8, num_workers=2), "unsplit")
train(DataLoader(Shards(split=True), batch_size=8, num_workers=2), "split")
"""


def test_run_names_duplicate_samples_for_workers_that_repeat_the_stream_and_not_for_a_split_one(tmp_path: Path):
    (tmp_path / "train.py").write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--json", "out.json", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=90,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n") == ["unsplit 256", "unsplit 256", "split 128", "split 128", ""]
    loaders = json.loads((tmp_path / "out.json").read_text())["loaders"]
    lines = textwrap.dedent(SCRIPT).splitlines()
    unsplit = f"train.py:{next(n for n, line in enumerate(lines, 1) if 'split=False), batch' in line)}"
    split = f"train.py:{next(n for n, line in enumerate(lines, 1) if 'split=True), batch' in line)}"
    assert set(loaders) == {unsplit, split}

    findings = {f["rule"]: f for f in loaders[unsplit]["findings"]}
    duplicate = findings["duplicate-samples"]
    assert duplicate["severity"] == "critical"
    assert duplicate["evidence"]["copies_of_each_sample"] == 2
    assert duplicate["evidence"]["samples_seen"] == 512  # 2 epochs of 128 samples, each delivered twice
    assert duplicate["evidence"]["distinct_samples"] == 256  # 128 an epoch
    assert "duplicate-samples" in result.stderr  # the summary names it
    assert "duplicate-samples" not in {f["rule"] for f in loaders[split]["findings"]}
