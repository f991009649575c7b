"""Fingerprints of the samples in a batch, to tell when workers (or the ranks of a distributed run) deliver
the same samples again; and the tally of one epoch's fingerprints. A fingerprint is the same in every process
(a digest, not Python's per-process salted hash of bytes and text)."""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

# Elements read from each sample of each tensor: enough to tell real samples apart, cheap on large images.
_ELEMENTS_PER_SAMPLE = 256


def _leaves(batch: Any) -> list[Any]:
    if isinstance(batch, Mapping):
        return [leaf for key in sorted(batch, key=str) for leaf in _leaves(batch[key])]
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (torch.Tensor, np.ndarray, Mapping)):
        return [leaf for value in batch for leaf in _leaves(value)]
    return [batch]


def _rows(leaf: Any, count: int) -> list[int] | None:
    """A hash per sample of one leaf of a collated batch; None when the leaf does not hold `count` samples."""
    if isinstance(leaf, np.ndarray):
        leaf = torch.from_numpy(leaf)
    if isinstance(leaf, torch.Tensor):
        if leaf.ndim == 0 or leaf.shape[0] != count:
            return None
        flat = leaf.detach().reshape(count, -1)
        stride = max(1, flat.shape[1] // _ELEMENTS_PER_SAMPLE)
        picked = flat[:, ::stride].contiguous().cpu().numpy()
        return [_digest(row.tobytes()) for row in picked]
    if isinstance(leaf, (list, tuple)) and len(leaf) == count:
        return [_digest(repr(value).encode()) for value in leaf]
    return None


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def sample_fingerprints(batch: Any, count: int) -> list[int] | None:
    """One fingerprint per sample of a collated batch of `count` samples (a hash of a spread of its values
    in every tensor); None when the batch's structure does not show its samples."""
    per_leaf = [rows for leaf in _leaves(batch) if (rows := _rows(leaf, count)) is not None]
    if not per_leaf or count <= 0:
        return None
    return [hash(values) for values in zip(*per_leaf, strict=True)]


class EpochTally:
    """The fingerprints of one epoch's samples: how many, how many distinct, and the typical copies of one."""

    def __init__(self) -> None:
        self._counts: collections.Counter[int] = collections.Counter()
        self.samples = 0

    def add(self, fingerprints: list[int]) -> None:
        self._counts.update(fingerprints)
        self.samples += len(fingerprints)

    @property
    def distinct(self) -> int:
        return len(self._counts)

    @property
    def typical_copies(self) -> int | None:
        """How many times the typical sample came: 1 when none repeats; 2 when each of two workers repeated the
        whole stream (the most common count, ties to the larger)."""
        if not self._counts:
            return None
        copies = collections.Counter(self._counts.values())
        return max(copies, key=lambda n: (copies[n], n))
