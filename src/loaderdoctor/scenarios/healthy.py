"""healthy: a light image pipeline that keeps up with its training step; nothing to report.

The reference for what a well-set-up loader looks like: crop, flip and normalise in two persistent worker
processes, started with the platform's default method, while a step several times longer than the loading
runs. The loop almost never waits, workers keep a flat memory footprint and no sample fails, so
loaderdoctor must stay silent: any finding here is a false alarm. Under DDP ranks (`loaderdoctor scale`) each
rank's loader takes a DistributedSampler, as a DDP job's does, and the ranks scale.
"""

from __future__ import annotations

from torch.utils.data import DataLoader

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import ImageDataset, rank_sampler

SUMMARY = "a light pipeline in 2 persistent workers, step longer than loading: no warning expected"


def build() -> Workload:
    dataset = ImageDataset(count=256, size=112, crop=96)
    loader = DataLoader(dataset, batch_size=32, sampler=rank_sampler(dataset), num_workers=2, persistent_workers=True)
    # Each next() costs about 2 ms however fast the workers are (the batch crosses processes through shared
    # memory): a step of realistic length keeps that well under 2% of the time.
    return Workload(train=loader, step_ms=200)
