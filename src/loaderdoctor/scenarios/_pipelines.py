"""Pieces the built-in scenarios share: seeded in-memory images, the usual crop, flip and normalise, and the
sampler a DDP job gives each rank."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

# ImageNet's per-channel mean and standard deviation, on the 0-255 scale of uint8 pixels.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


def seeded_images(count: int, size: int, seed: int = 0) -> np.ndarray:
    """`count` random uint8 RGB images of size x size, shape (count, size, size, 3), the same for a seed."""
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def sample_rng(index: int, seed: int = 0) -> np.random.Generator:
    """The random generator of one sample: the same augmentation for an index wherever it is loaded."""
    return np.random.default_rng([seed, index])


def crop_flip_normalise(image: np.ndarray, rng: np.random.Generator, crop: int) -> np.ndarray:
    """A random crop x crop window of an HxWx3 uint8 image, flipped left-right half the time, as
    normalised float32 HxWx3."""
    top = int(rng.integers(0, image.shape[0] - crop + 1))
    left = int(rng.integers(0, image.shape[1] - crop + 1))
    window = image[top : top + crop, left : left + crop]
    if rng.random() < 0.5:
        window = window[:, ::-1]
    return (window.astype(np.float32) - IMAGENET_MEAN) / IMAGENET_STD


def to_chw_tensor(image: np.ndarray) -> torch.Tensor:
    """An HxWxC array as the contiguous CxHxW tensor a model takes."""
    return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))


def rank_sampler(dataset: Dataset, *, shuffle: bool = False) -> DistributedSampler | None:
    """The sampler a DDP job gives each rank's loader: a DistributedSampler when torch.distributed's process
    group is up (as in the ranks of `loaderdoctor scale`), else None (the loader's own)."""
    if dist.is_available() and dist.is_initialized():
        return DistributedSampler(dataset, shuffle=shuffle)
    return None


class ImageDataset(Dataset):
    """Seeded in-memory images with labels; a sample is (CxHxW float tensor, label) after crop, flip and
    normalise. Scenarios subclass it and change `transform` or `__getitem__` to plant their cause."""

    def __init__(self, count: int, size: int = 160, crop: int = 128, classes: int = 10, seed: int = 0) -> None:
        self.images = seeded_images(count, size, seed)
        self.labels = np.random.default_rng(seed + 1).integers(0, classes, count)
        self.crop = crop
        self.seed = seed

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.transform(self.images[index], sample_rng(index, self.seed))
        return to_chw_tensor(image), int(self.labels[index])

    def transform(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The augmentation of one HxWx3 uint8 image, returning float32 HxWxC."""
        return crop_flip_normalise(image, rng, self.crop)
