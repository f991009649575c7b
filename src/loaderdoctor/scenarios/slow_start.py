"""slow-start: a dataset carrying a whole annotation file is pickled to every spawned worker.

Reproduces a detection fine-tune on a small Subset of a COCO-style dataset whose object keeps every
annotation of the full file as Python dicts (boxes, categories, RLE masks). Under spawn (the default on
macOS and Windows, chosen on Linux to stay clear of fork problems) the DataLoader pickles the dataset, all of
it, once for each worker, and each worker rebuilds hundreds of thousands of objects before its first batch.
With short epochs the start-up costs more than the training. The fix: a lean `__getstate__` that leaves the
annotations out and loads them lazily in each worker (or keeps them in numpy arrays), or forked workers,
which share the parent's memory instead of unpickling a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import IMAGENET_MEAN, IMAGENET_STD, seeded_images, to_chw_tensor

SUMMARY = "a Subset of a dataset holding 200k annotation dicts, pickled to each of 2 spawned workers"

ANNOTATIONS = 200_000
ANNOTATIONS_PER_IMAGE = 7
RLE_CHARS = 120  # a compressed RLE mask, as COCO stores crowd and fine-grained segmentations
SOURCE_SIZE = 480  # boxes are in the coordinates of 480x480 originals
STORED_IMAGES = 64  # the pixels: a few stored thumbnails stand in for the image files
THUMBNAIL_SIZE = 96
CROP = 48


def coco_style_annotations(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` annotations as a COCO instances file holds them: one dict per object, the same for a seed."""
    rng = np.random.default_rng(seed)
    corners = rng.uniform(0, SOURCE_SIZE - 120, (count, 2))
    sizes = rng.uniform(8, 120, (count, 2))
    boxes = np.concatenate([corners, sizes], axis=1).round(2).tolist()
    categories = rng.integers(1, 91, count).tolist()
    masks = rng.integers(48, 112, (count, RLE_CHARS), dtype=np.uint8).tobytes().decode("ascii")
    return [
        {
            "id": i,
            "image_id": i // ANNOTATIONS_PER_IMAGE,
            "category_id": categories[i],
            "bbox": boxes[i],
            "area": round(boxes[i][2] * boxes[i][3], 2),
            "iscrowd": 0,
            "segmentation": masks[i * RLE_CHARS : (i + 1) * RLE_CHARS],
        }
        for i in range(count)
    ]


class ObjectCrops(Dataset):
    """One sample per annotated object: a normalised crop around its box and its category."""

    def __init__(self, annotations: list[dict[str, Any]], seed: int = 0) -> None:
        self.annotations = annotations
        self.thumbnails = seeded_images(STORED_IMAGES, THUMBNAIL_SIZE, seed)

    def __len__(self) -> int:
        return len(self.annotations)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        annotation = self.annotations[index]
        image = self.thumbnails[annotation["image_id"] % STORED_IMAGES]
        x, y, width, height = annotation["bbox"]
        scale = THUMBNAIL_SIZE / SOURCE_SIZE
        top = int(np.clip((y + height / 2) * scale - CROP / 2, 0, THUMBNAIL_SIZE - CROP))
        left = int(np.clip((x + width / 2) * scale - CROP / 2, 0, THUMBNAIL_SIZE - CROP))
        crop = image[top : top + CROP, left : left + CROP].astype(np.float32)
        return to_chw_tensor((crop - IMAGENET_MEAN) / IMAGENET_STD), annotation["category_id"]


def build() -> Workload:
    # A quick experiment on the first 640 objects: Subset keeps (and pickles) the whole dataset.
    dataset = Subset(ObjectCrops(coco_style_annotations(ANNOTATIONS)), range(640))
    loader = DataLoader(dataset, batch_size=32, num_workers=2, persistent_workers=True, multiprocessing_context="spawn")
    return Workload(train=loader, step_ms=10)
