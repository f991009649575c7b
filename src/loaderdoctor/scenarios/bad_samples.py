"""bad-samples: a few files of the dataset are corrupt, and each one raises inside a worker.

Reproduces "Caught ValueError in DataLoader worker process 1": a healthy pipeline over a large image set in
which about 2.5% of the files are truncated or damaged. Each one raises in `__getitem__`, the DataLoader
re-raises it in the training loop and the whole batch (and, without a try/except, the run) is lost. The fix
is in the data, not the settings: list the bad files, repair or drop them, or skip them in the dataset and
keep batches full.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import ImageDataset

SUMMARY = "about 2.5% of the images are corrupt and raise ValueError in the workers"

CORRUPT_SHARE = 0.025
SHARDS = 8


class ShardedImages(ImageDataset):
    """Images stored as shard-N/img_XXXXX.jpg, a seeded CORRUPT_SHARE of which fail to decode."""

    def __init__(self, count: int, size: int = 112, crop: int = 96) -> None:
        super().__init__(count, size=size, crop=crop)
        corrupt_count = max(1, round(count * CORRUPT_SHARE))
        rng = np.random.default_rng(self.seed + 2)
        self.corrupt = frozenset(int(i) for i in rng.choice(count, size=corrupt_count, replace=False))

    def path(self, index: int) -> str:
        return f"shard-{index % SHARDS}/img_{index:05d}.jpg"

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index in self.corrupt:
            raise ValueError(f"truncated JPEG data in {self.path(index)}")
        return super().__getitem__(index)


def build() -> Workload:
    dataset = ShardedImages(count=320)
    loader = DataLoader(dataset, batch_size=32, num_workers=2, persistent_workers=True)
    return Workload(train=loader, step_ms=150)
