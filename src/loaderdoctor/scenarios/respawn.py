"""respawn: workers are started again every epoch, each time under spawn, and short epochs pay for it.

Reproduces open-mmlab/mmpose#923 and pytorch/pytorch#87802: a DataLoader with persistent_workers=False
(the default) and the spawn start method (the default on macOS and Windows, and chosen on Linux to stay
clear of fork problems). Every `iter()` starts new worker processes, and every spawned worker imports torch
and unpickles the dataset again before its first batch: about a second per epoch here, more than the
epoch's own work. The fix: persistent_workers=True, so workers start once and serve every epoch.
"""

from __future__ import annotations

from torch.utils.data import DataLoader

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import ImageDataset

SUMMARY = "spawn workers without persistent_workers: each short epoch starts them again (1-2 s)"


def build() -> Workload:
    dataset = ImageDataset(count=320, size=72, crop=64)
    loader = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context="spawn")
    return Workload(train=loader, step_ms=10)
