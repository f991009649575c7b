"""demo: augmentation runs in the training process (num_workers=0), so the step waits for every batch.

Reproduces the most common report of a slow training job: a DataLoader built with the default
num_workers=0 while each sample gets a crop, a flip, normalisation and a costly filter. All of that runs
between two training steps and the accelerator idles. The fix: load in worker processes
(num_workers = usable cores, persistent_workers=True), which prepare batches while the step runs.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import DataLoader

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import ImageDataset

SUMMARY = "image augmentation in the main process (num_workers=0): the step waits for every batch"

BLUR_SIZE = 9


def box_blur(image: np.ndarray, size: int = BLUR_SIZE) -> np.ndarray:
    """The image averaged over a size x size window, computed naively (one shifted sum per tap)."""
    radius = size // 2
    padded = np.pad(image, ((radius, radius), (radius, radius), (0, 0)), mode="edge")
    height, width = image.shape[:2]
    total = np.zeros_like(image)
    for dy in range(size):
        for dx in range(size):
            total += padded[dy : dy + height, dx : dx + width]
    return total / (size * size)


class BlurredImages(ImageDataset):
    """Images with crop, flip, normalise and a 9x9 box blur standing in for costly augmentation."""

    def transform(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return box_blur(super().transform(image, rng))


def build() -> Workload:
    dataset = BlurredImages(count=512, size=160, crop=128)
    return Workload(train=DataLoader(dataset, batch_size=32, num_workers=0), step_ms=20)
