"""Fingerprints of the samples in a batch, to tell when workers (or the ranks of a distributed run) deliver
the same samples again; and the tally of one epoch's fingerprints. A fingerprint is the same in every process
(a digest, not Python's per-process salted hash of bytes and text). The tap fingerprints what it delivers
(tap.py); the probe and a watched run tally each epoch's fingerprints here and record them alike."""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

# Elements read from each sample of each tensor: enough to tell real samples apart, cheap on large images.
_ELEMENTS_PER_SAMPLE = 256
# Samples fingerprinted and tallied per epoch, the epoch's first ones: workers that repeat one stream deliver
# its copies side by side, so the first samples show them; this bounds the work and memory of an epoch of a run
# that goes on for hours (the tally keeps a count per distinct sample: a few MB at most).
TALLIED_PER_EPOCH = 50_000


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
        try:
            flat = leaf.detach().reshape(count, -1)
            stride = max(1, flat.shape[1] // _ELEMENTS_PER_SAMPLE)
            # As bytes: numpy has no bfloat16 (nor torch's other narrow floats).
            picked = flat[:, ::stride].contiguous().cpu().view(torch.uint8).numpy()
        except (RuntimeError, TypeError):  # a sparse, nested or quantized tensor: its values are not read here
            return None
        return [_digest(row.tobytes()) for row in picked]
    if isinstance(leaf, (list, tuple)) and len(leaf) == count:
        try:
            return [_digest(repr(value).encode()) for value in leaf]
        except Exception:  # a user's object whose repr() raises: never the training loop's failure
            return None
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
    """The fingerprints of one epoch's samples: how many, how many distinct, and the typical copies of one; the
    first `limit` samples only. Fed by recording/epochbook.py, for the probe and a watched run alike, from
    the tap's BatchDelivered events, and recorded by both with record_fields()."""

    def __init__(self, limit: int = TALLIED_PER_EPOCH) -> None:
        self._counts: collections.Counter[int] = collections.Counter()
        self.samples = 0
        self.limit = limit

    def add(self, fingerprints: list[int] | None) -> None:
        """A batch's fingerprints (None: its samples could not be told apart, or were not fingerprinted)."""
        if not fingerprints or self.samples >= self.limit:
            return
        kept = fingerprints[: self.limit - self.samples]
        self._counts.update(kept)
        self.samples += len(kept)

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

    def record_fields(self) -> dict[str, Any]:
        """The tally as an EpochRecord's fields (recording.py): samples_fingerprinted (at most `limit`, the epoch's
        first ones), distinct_samples and typical_copies."""
        return {
            "samples_fingerprinted": self.samples,
            "distinct_samples": self.distinct if self.samples else None,
            "typical_copies": self.typical_copies,
        }
