"""no-distributed-sampler: a DDP job whose loader has no DistributedSampler, so every rank loads everything.

Reproduces the most common DDP mistake: the single-process training script moved to torchrun unchanged. The
loader shuffles with its own RandomSampler in every rank, each rank iterates the whole dataset, and since
every rank's generator starts from the same seed, all of them train on the same samples in the same order:
N GPUs do N times the loading and learn what one would. One process alone has nothing wrong; `loaderdoctor
scale` finds it by comparing the indices the ranks' samplers give. The fix: a DistributedSampler, with
set_epoch(epoch) before each epoch.
"""

from __future__ import annotations

from torch.utils.data import DataLoader

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import ImageDataset

SUMMARY = "a DDP loader without DistributedSampler: every rank loads the whole dataset (found by `scale`)"
FOUND_BY = "scale"


def build() -> Workload:
    dataset = ImageDataset(count=512, size=112, crop=96)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
    return Workload(train=loader, step_ms=50)
