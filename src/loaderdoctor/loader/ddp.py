"""The DDP plan: what torch's DistributedSampler and DataLoader give each rank per epoch, the optimizer steps and
effective batch that follow, the learning rate scaled to it, and what keeps that batch at other world sizes."""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass
from typing import Any

from loaderdoctor.errors import UsageError
from loaderdoctor.plain.data import dataclass_from_dict

# The world sizes a plan always says how to keep its effective batch at, besides its own and twice its own.
_COMMON_WORLD_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class SameEffectiveBatch:
    """At one world size, the per-rank batch (with the plan's accumulation) or the accumulation (with the plan's
    per-rank batch) that keeps the plan's effective batch; either may come out fractional, which no run can use."""

    world_size: int
    batch_size: float
    grad_accum: float

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"a world size is 1 or more, not {self.world_size}")

    @property
    def batch_size_is_whole(self) -> bool:
        return float(self.batch_size).is_integer()

    @property
    def grad_accum_is_whole(self) -> bool:
        return float(self.grad_accum).is_integer()


@dataclass(frozen=True)
class DdpPlan:
    """One epoch of a DDP run as torch computes it. Sample counts are per rank unless named `total`; the learning
    rates are None without a base learning rate (the one for one process, batch `batch_size`, no accumulation)."""

    dataset_size: int
    batch_size: int
    world_size: int
    grad_accum: int
    drop_last: bool  # the DataLoader's: drop each rank's last, partial batch
    sampler_drop_last: bool  # DistributedSampler's: drop the dataset's tail instead of repeating its head
    base_lr: float | None
    samples_per_rank: int  # len(DistributedSampler) on every rank
    total_samples: int  # the sampler's total_size: samples drawn across all ranks per epoch
    repeated_samples: int  # indices the sampler draws a second time so every rank gets as many
    dropped_by_sampler: int  # samples of the dataset no rank sees (sampler drop_last)
    batches_per_rank: int  # len(DataLoader) on every rank
    last_batch_size: int  # samples in each rank's last batch (batch_size when it is full; 0 without batches)
    dropped_by_loader_per_rank: int  # samples of each rank's partial last batch that drop_last drops
    optimizer_steps: int  # full accumulation cycles per epoch
    leftover_batches: int  # batches after the last full cycle, which never reach an optimizer step
    effective_batch_size: int  # batch_size * world_size * grad_accum: samples per optimizer step
    lr_scale: int  # world_size * grad_accum: the effective batch over the reference batch of one process
    linear_lr: float | None
    sqrt_lr: float | None
    same_effective_batch: tuple[SameEffectiveBatch, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DdpPlan:
        return dataclass_from_dict(cls, data)


def ddp_plan(
    dataset_size: int,
    batch_size: int,
    world_size: int,
    *,
    grad_accum: int = 1,
    drop_last: bool = False,
    sampler_drop_last: bool = False,
    base_lr: float | None = None,
) -> DdpPlan:
    """The plan of one epoch of `dataset_size` samples, in batches of `batch_size` per rank, over `world_size`
    ranks that each use a DistributedSampler (`sampler_drop_last` is its drop_last) and a DataLoader (`drop_last`
    is its own), stepping the optimizer every `grad_accum` batches. Raises UsageError on a size below 1 or a
    base learning rate that is not a positive number."""
    dataset_size = _whole("dataset_size", dataset_size, "samples")
    batch_size = _whole("batch_size", batch_size, "samples")
    world_size = _whole("world_size", world_size, "ranks")
    grad_accum = _whole("grad_accum", grad_accum, "batches")
    if base_lr is not None:
        base_lr = _learning_rate(base_lr)

    # DistributedSampler.__init__: with its drop_last and an uneven split, ceil((N - W) / W), which is N // W.
    if sampler_drop_last and dataset_size % world_size:
        samples_per_rank = dataset_size // world_size
    else:
        samples_per_rank = math.ceil(dataset_size / world_size)
    total_samples = samples_per_rank * world_size
    repeated = max(total_samples - dataset_size, 0)  # __iter__ pads by repeating indices from the start
    dropped_by_sampler = max(dataset_size - total_samples, 0)  # or, with its drop_last, cuts the tail

    # DataLoader.__len__ over a sampler: floor with drop_last, ceil without.
    partial = samples_per_rank % batch_size
    if drop_last:
        batches = samples_per_rank // batch_size
        last_batch_size = batch_size if batches else 0
        dropped_by_loader = partial
    else:
        batches = math.ceil(samples_per_rank / batch_size)
        last_batch_size = partial or (batch_size if batches else 0)
        dropped_by_loader = 0

    lr_scale = world_size * grad_accum
    effective = batch_size * lr_scale
    return DdpPlan(
        dataset_size=dataset_size,
        batch_size=batch_size,
        world_size=world_size,
        grad_accum=grad_accum,
        drop_last=bool(drop_last),
        sampler_drop_last=bool(sampler_drop_last),
        base_lr=base_lr,
        samples_per_rank=samples_per_rank,
        total_samples=total_samples,
        repeated_samples=repeated,
        dropped_by_sampler=dropped_by_sampler,
        batches_per_rank=batches,
        last_batch_size=last_batch_size,
        dropped_by_loader_per_rank=dropped_by_loader,
        optimizer_steps=batches // grad_accum,
        leftover_batches=batches % grad_accum,
        effective_batch_size=effective,
        lr_scale=lr_scale,
        linear_lr=None if base_lr is None else base_lr * lr_scale,
        sqrt_lr=None if base_lr is None else base_lr * math.sqrt(lr_scale),
        same_effective_batch=tuple(
            SameEffectiveBatch(
                world_size=size,
                batch_size=_exact(effective, size * grad_accum),
                grad_accum=_exact(effective, size * batch_size),
            )
            for size in sorted({*_COMMON_WORLD_SIZES, world_size, 2 * world_size})
        ),
    )


def _whole(name: str, value: int, unit: str) -> int:
    """`value` as an int of 1 or more, or a UsageError naming the parameter."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise UsageError(
            f"{name} must be a whole number of {unit}, not {value!r}", hint=f"pass {name} as an int, 1 or more"
        ) from None
    if number < 1:
        raise UsageError(f"{name} must be 1 or more {unit}, not {number}", hint=f"pass {name} as 1 or more")
    return number


def _learning_rate(value: float) -> float:
    """`value` as a positive finite float, or a UsageError."""
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = math.nan
    if isinstance(value, bool) or not math.isfinite(rate) or rate <= 0:
        raise UsageError(
            f"base_lr must be a positive finite number, not {value!r}",
            hint="pass the learning rate of one process with the same per-rank batch and no accumulation, or None",
        )
    return rate


def _exact(numerator: int, denominator: int) -> float:
    """numerator / denominator, kept an int when it divides evenly so a whole answer prints as one."""
    quotient, remainder = divmod(numerator, denominator)
    return quotient if not remainder else numerator / denominator
