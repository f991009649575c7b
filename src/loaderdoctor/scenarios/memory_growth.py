"""memory-growth: each worker keeps every decoded image it produces, in a cache that never hits.

Reproduces the per-worker cache that was meant to save decoding time: decoded images are stored under a key
that includes the epoch (or a random augmentation parameter), so no lookup ever hits and nothing is ever
evicted. With persistent workers the cache lives as long as the run: each worker's memory grows by the
decoded size of every sample it has seen, until the OOM killer ends the job (pytorch/pytorch#13246 shows
the same symptom). The fix: a bounded cache (functools.lru_cache(maxsize=...)) keyed by what really
determines the content, or no cache at all.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import ImageDataset, sample_rng, to_chw_tensor

SUMMARY = "a per-worker cache keyed by (index, epoch) keeps ~1 MB per sample: worker memory grows every batch"

DECODE_SCALE = 2  # stored thumbnails are decoded to twice their size: 160 -> 320 px, float32, 1.2 MB


class CachedDecodeImages(ImageDataset):
    """Images decoded to full resolution and cached per worker under (index, epoch): the cache never hits."""

    def __init__(self, count: int, size: int = 160, crop: int = 128) -> None:
        super().__init__(count, size=size, crop=crop)
        self.decoded: dict[tuple[int, int], np.ndarray] = {}
        self.visits: dict[int, int] = {}

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        epoch = self.visits.get(index, 0)
        self.visits[index] = epoch + 1
        key = (index, epoch)  # the bug: the epoch makes every key new, so the cache only ever grows
        if key not in self.decoded:
            self.decoded[key] = self.decode(self.images[index])
        full = self.decoded[key]
        rng = sample_rng(index, self.seed)
        top, left = (int(v) for v in rng.integers(0, full.shape[0] - self.crop + 1, size=2))
        return to_chw_tensor(full[top : top + self.crop, left : left + self.crop]), int(self.labels[index])

    def decode(self, image: np.ndarray) -> np.ndarray:
        """The stored image at DECODE_SCALE times its size as float32 in [0, 1], as a decoder returns it."""
        upscaled = image.repeat(DECODE_SCALE, axis=0).repeat(DECODE_SCALE, axis=1)
        return upscaled.astype(np.float32) / 255


def build() -> Workload:
    dataset = CachedDecodeImages(count=256)
    loader = DataLoader(dataset, batch_size=16, num_workers=2, persistent_workers=True)
    return Workload(train=loader, step_ms=100)
