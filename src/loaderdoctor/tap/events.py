"""The plain events the tap emits (tap/iterator.py) to whoever records a run (the probe's session, a watch's
recorder), and what a delivered batch holds: its bytes and its samples."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from loaderdoctor.host.forkhazards import IteratorFacts


@dataclass(frozen=True)
class IteratorCreated:
    epoch: int
    facts: IteratorFacts | None  # taken just before iter() starts workers; None when none start
    worker_pids: list[int]
    create_s: float  # time spent in iter() itself


@dataclass(frozen=True)
class BatchDelivered:
    epoch: int
    index: int
    wait_s: float
    wait_cpu_s: float
    nbytes: int
    samples: int
    first_batch_s: float | None  # from iter() to this batch, for the first batch of an epoch
    # One per sample (fingerprints.py), for an IterableDataset's first TALLIED_PER_EPOCH samples of an epoch:
    # whether its workers deliver the same samples. None for a map-style dataset, or when not told apart.
    fingerprints: list[int] | None = None
    # The dataset indices the loader's sampler gave torch's iterator since the last delivery (tap/drawn.py: a
    # watch's first epoch of a map-style dataset; torch's workers draw ahead, so they are not this batch's alone).
    # None when none were noted.
    indices: list[int] | None = None
    # Seconds of the wait the waiting thread was runnable but not running (other processes held the cores): the
    # machine's time, not the data's. None where the kernel does not count it.
    wait_run_delay_s: float | None = None
    # For the first batch of an iter() that started workers: the seconds its first worker (which loads the first
    # batch) was runnable but descheduled since it started, or the loop's own thread during the wait if more. The
    # start-up's share that is the machine's load, not the loader's. None otherwise, or where not counted.
    startup_run_delay_s: float | None = None
    # For the batch before this one of the same iterator: the seconds the loop's thread was runnable but not
    # running between that batch's delivery and this next() (the step's descheduled time). None for an epoch's
    # first batch, or where not counted.
    step_run_delay_s: float | None = None


@dataclass(frozen=True)
class BatchFailed:
    epoch: int
    index: int
    wait_s: float
    error: BaseException


@dataclass(frozen=True)
class EpochEnded:
    epoch: int
    batches: int
    wall_s: float
    wait_s: float = 0.0  # the time in the next() that raised StopIteration (ending workers that do not persist)


@dataclass(frozen=True)
class DataFreeBatch:
    """A data-free step (`run --ceiling`, tap/ceiling.py): next() handed the loop the batch it delivered last
    again, taking nothing from the loader. No batch of the loader's: the step before it ends here."""

    epoch: int


@dataclass(frozen=True)
class WorkersStarted:
    """The workers of an epoch whose loader's own iterator (a generator around torch's: litdata's
    StreamingDataLoader) started torch's only at its first next(): found then, before that batch is told."""

    epoch: int
    worker_pids: list[int]


Event = IteratorCreated | WorkersStarted | BatchDelivered | BatchFailed | EpochEnded | DataFreeBatch
Listener = Callable[[Event], None]


def batch_nbytes(batch: Any) -> int:
    """Bytes of tensor and array data in a batch of any nesting of tuples, lists and dicts."""
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, Mapping):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v) for v in batch)
    return 0


def batch_samples(batch: Any, default: int) -> int:
    """How many samples a batch holds: the first tensor's leading dimension, else `default`."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0]) if batch.ndim else default
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        if isinstance(value, (torch.Tensor, np.ndarray, Mapping, list, tuple)):
            return batch_samples(value, default)
    return default
