"""starved: every sample waits on slow storage, and two workers keep too few reads in flight.

Reproduces training from network storage (NFS, a bucket behind a FUSE mount, a busy shared disk): each
image takes milliseconds to arrive and almost no CPU to decode. Two workers spend nearly all their time
waiting, so the step waits too, while the cores stay idle. The fix: many more workers than cores
(here 8 on a 2-core machine), kept alive between epochs, so that more reads are in flight at once.
"""

from __future__ import annotations

import time

import numpy as np
from torch.utils.data import DataLoader

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import ImageDataset

SUMMARY = "each sample waits ~8 ms on storage: 2 workers starve the step, more workers than cores help"

STORAGE_LATENCY_S = 0.008


class RemoteImages(ImageDataset):
    """Images read from slow storage: each waits STORAGE_LATENCY_S for its bytes, then gets a light decode."""

    def transform(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        time.sleep(STORAGE_LATENCY_S)  # the read: the process waits, the core is free
        return super().transform(image, rng)


def build() -> Workload:
    dataset = RemoteImages(count=384, size=80, crop=64)
    loader = DataLoader(dataset, batch_size=16, num_workers=2, persistent_workers=True)
    return Workload(train=loader, step_ms=20)
