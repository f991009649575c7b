"""The batch plan: an epoch's batches of indices, drawn once from the user's sampler, and a sampler that
replays them from any batch on. An IterableDataset has no plan (guard/streams.py resumes it instead)."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.streams import is_resumable_stream


@dataclass(frozen=True)
class EpochPlan:
    """What one epoch delivers, in order, and the random state its workers are seeded from."""

    # Lists of indices; single indices when the loader does not collate (batch_size=None); none for an
    # IterableDataset, which has no indices.
    batches: list[Any]
    # The state of the generator that the plain DataLoader's iter() draws its workers' base seed from,
    # just before that draw; None when the plain DataLoader would draw none this epoch.
    seed_state: torch.Tensor | None


def check_resumable(loader: DataLoader) -> None:
    """Raise a UsageError unless the guard can resume `loader` exactly after a restart: any map-style dataset
    (by its batch plan), an IterableDataset that offers state_dict()/load_state_dict() (see guard/streams.py)."""
    dataset = loader.dataset
    if not isinstance(dataset, IterableDataset) or is_resumable_stream(dataset):
        return
    kind = type(dataset).__name__
    raise UsageError(
        f"the guard cannot resume the IterableDataset {kind}: without state_dict()/load_state_dict() a restart "
        "would repeat or drop samples",
        hint="give it state_dict() (where its iteration stands) and load_state_dict() (continue from there); or "
        "use a map-style Dataset (__getitem__ and __len__), or the plain DataLoader for this one",
    )


def draw_epoch_plan(loader: DataLoader, *, draws_base_seed: bool) -> EpochPlan:
    """The next epoch of `loader`, drawn from its sampler exactly once.

    A plain DataLoader's iter() first draws its workers' base seed from the loader's generator (the global
    one when it has none), then its sampler draws the order: the plan makes the same draws in the same
    order, so that it holds the batches the plain DataLoader would deliver with the same seed.
    `draws_base_seed` says whether the plain DataLoader would create a new iterator this epoch (always but
    for a later epoch of persistent workers). An IterableDataset's epoch has no plan: only the seed is drawn.
    """
    check_resumable(loader)
    seed_state = None
    if draws_base_seed:
        source = loader.generator if loader.generator is not None else torch.default_generator
        seed_state = source.get_state()
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
    if isinstance(loader.dataset, IterableDataset):
        return EpochPlan([], seed_state)  # its sampler is endless: the dataset decides where the epoch ends
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    return EpochPlan(list(iter(sampler)), seed_state)


def plan_generators(loader: DataLoader) -> dict[str, torch.Generator]:
    """The generators `loader`'s plans are drawn from, each named by where it sits, each named once: the
    loader's, its sampler's, its batch sampler's sampler's. Torch's global generator, used when none is
    given, is not among them: saving and restoring it (torch.get_rng_state()) is the user's."""
    places = {
        "generator": loader.generator,
        "sampler.generator": getattr(loader.sampler, "generator", None),
        "batch_sampler.sampler.generator": getattr(getattr(loader.batch_sampler, "sampler", None), "generator", None),
    }
    found: dict[str, torch.Generator] = {}
    for place, generator in places.items():
        if isinstance(generator, torch.Generator) and all(generator is not seen for seen in found.values()):
            found[place] = generator
    return found


def plain_batches(batches: Sequence[Any], *, batched: bool) -> list[Any]:
    """`batches` of a plan as JSON-ready data: lists of ints, or ints when not `batched` (batch_size=None);
    a UsageError when an index is not a whole number."""
    try:
        if batched:
            return [[operator.index(index) for index in batch] for batch in batches]
        return [operator.index(index) for index in batches]
    except TypeError as error:
        raise UsageError(
            f"the guard saves a plan of whole-number indices only, and this loader's sampler yields others: {error}",
            hint="state_dict() needs a sampler that yields ints (or lists of ints)",
        ) from error


class PlannedBatchSampler(Sampler):
    """Yields plan[start:]: the batches of an epoch not yet delivered. Both may be changed between iter()
    calls, so that a DataLoader with persistent workers can be given each epoch's plan."""

    def __init__(self, plan: Sequence[Any], start: int = 0) -> None:
        self.plan: Sequence[Any] = []
        self.start = 0
        self.replan(plan, start)

    def replan(self, plan: Sequence[Any], start: int = 0) -> None:
        if not 0 <= start <= len(plan):
            raise ValueError(f"start {start} is outside a plan of {len(plan)} batches")
        self.plan = plan
        self.start = start

    def __iter__(self) -> Iterator[Any]:
        # islice binds the current plan now: a later replan() does not change an iteration under way.
        return itertools.islice(self.plan, self.start, None)

    def __len__(self) -> int:
        return len(self.plan) - self.start
