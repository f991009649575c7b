"""oversubscribed: each worker enlarges torch's thread pool, so 2 workers run 32 threads on the cores.

Reproduces a worker_init_fn with `torch.set_num_threads(16)  # speed up transforms` (OpenCV's and BLAS's
per-core pools do the same unasked): every worker runs its tensor transforms with a pool of 16 threads, on
a machine where the workers alone already fill the cores. Threads wait for each other and for the cores
instead of computing, and loading gets slower than with one thread per worker (PyTorch sets one by default
in workers, which this undoes). The fix: one thread per worker (`torch.set_num_threads(1)` in
worker_init_fn, `cv2.setNumThreads(0)` with OpenCV), and as many workers as cores.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import sample_rng

SUMMARY = "worker_init_fn sets 16 torch threads in each of 2 workers: 32 threads fight for the cores"

THREADS_PER_WORKER = 16
IMAGE_SIZE = 40
FILTER_CHANNELS = (3, 8, 8, 8, 8, 3)  # a small 5-layer bank of 5x5 filters applied to every sample


def enlarge_thread_pool(worker_id: int) -> None:
    """worker_init_fn: give the worker's tensor transforms a large thread pool (the mistake)."""
    torch.set_num_threads(THREADS_PER_WORKER)  # speed up transforms


class FilteredImages(Dataset):
    """Seeded random images run through a fixed bank of 5x5 convolutions, as a denoising transform would."""

    def __init__(self, count: int, seed: int = 0) -> None:
        self.count = count
        self.seed = seed
        generator = torch.Generator().manual_seed(seed)
        self.filters = [
            torch.randn(out, inp, 5, 5, generator=generator) / (inp * 25) ** 0.5
            for inp, out in itertools.pairwise(FILTER_CHANNELS)
        ]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        pixels = sample_rng(index, self.seed).standard_normal((1, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
        image = torch.from_numpy(pixels)
        for weights in self.filters:
            image = F.conv2d(image, weights, padding=2)
        return image[0], index % 10


def build() -> Workload:
    dataset = FilteredImages(count=896)
    loader = DataLoader(
        dataset, batch_size=56, num_workers=2, persistent_workers=True, worker_init_fn=enlarge_thread_pool
    )
    return Workload(train=loader, step_ms=40)
