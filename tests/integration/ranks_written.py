"""What the two-rank training scripts of test_trainer_ranks.py share: their starved dataset, and what a rank writes of
its report for the test to read."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset


class Slow(Dataset):
    """400 samples of 4 values (each its index), 4 ms each to load."""

    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.004)
        return torch.full((4,), float(index))


def write_rank(path: Path, report: Any, **more: Any) -> None:
    """The report's ceiling and findings (the job's ceiling's evidence apart), with `more`, to `path` as JSON."""
    ceiling = report.recording.ceiling
    written = {
        **more,
        "batches": sum(epoch.batches for epoch in report.recording.epochs),
        "data_free_steps": ceiling.data_free_steps if ceiling else None,
        "complete": ceiling.complete if ceiling else None,
        "rules": [finding.rule for finding in report.findings],
        "job": {k: v for f in report.findings if f.rule == "job-ceiling" for k, v in f.evidence.items()},
    }
    path.write_text(json.dumps(written))
