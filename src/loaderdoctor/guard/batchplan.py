"""The batch plan: an epoch's batches of indices, drawn from the user's sampler only as loading asks for them,
and a sampler that replays them from any batch on. An IterableDataset has no plan (guard/streams.py resumes
it instead).

The plan never holds the epoch: only the batches drawn and not yet delivered (the workers' prefetch, a few),
so that an endless sampler works and a dataset of any length starts as fast as the plain DataLoader. A
restart replays those, then draws on from the same sampler iterator. A saved state holds the position and the
generators' states at the epoch's start; loading it draws the epoch again up to the position (see `replayed`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.streams import is_resumable_stream
from loaderdoctor.loader.facts import length_or_none


class EpochPlan:
    """What one epoch delivers, in order, drawn once from the user's sampler as it is asked for, and the random
    states it started from.

    `seed_state`: the state of the generator that the plain DataLoader's iter() draws its workers' base seed
    from, just before that draw (None when the plain DataLoader would draw none this epoch). `start_states`:
    the states of the plan's generators (see plan_generators) and of torch's global one right after it, when
    the sampler had drawn nothing yet: drawing the epoch again from them gives the same batches. A plan made
    with `states_of` (the loader) takes them just before its first draw, as a sampler draws lazily: the user's
    code may draw from the global generator between iter() and the first next().
    """

    def __init__(
        self,
        source: Iterator[Any] | None,
        *,
        length: int | None,
        seed_state: torch.Tensor | None = None,
        start_states: dict[str, torch.Tensor] | None = None,
        global_state: torch.Tensor | None = None,
        states_of: DataLoader | None = None,
    ) -> None:
        self._source = source  # None: an IterableDataset's epoch, or an epoch known to be over
        self.length = length  # the number of batches, when the sampler has a len()
        self.seed_state = seed_state
        self.start_states = start_states or {}
        self.global_state = global_state
        self._drawn: dict[int, Any] = {}  # position -> batch, drawn and not yet delivered
        self._next_draw = 0  # the position of the next batch to draw from the source
        self._kept_from = 0  # no batch before this position is kept
        self._ended_at: int | None = None  # the number of batches, once the source has ended
        self._states_of = states_of  # the loader whose generators' states are taken at the first draw

    def starting_states(self) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """The plan's generators' states and the global one when the epoch's first batch was (or will be) drawn."""
        if self._states_of is not None:
            self.start_states = generator_states(self._states_of)
            self.global_state = torch.default_generator.get_state()
            self._states_of = None
        return self.start_states, self.global_state

    def batch(self, position: int) -> Any:
        """The batch at `position`, drawn from the sampler if it is not yet; IndexError past the epoch's end and
        for a batch delivered already (dropped)."""
        while self._next_draw <= position and self._ended_at is None:
            try:
                if self._source is None:
                    raise StopIteration
                if self._states_of is not None:
                    self.starting_states()
                batch = next(self._source)
            except StopIteration:
                self._ended_at = self._next_draw
                break
            self._drawn[self._next_draw] = batch
            self._next_draw += 1
        if position in self._drawn:
            return self._drawn[position]
        raise IndexError(position)

    def batches_from(self, start: int) -> Iterator[tuple[int, Any]]:
        """(position, batch) from `start` to the epoch's end, drawing as they are asked for."""
        position = start
        while True:
            try:
                batch = self.batch(position)
            except IndexError:
                return
            yield position, batch
            position += 1

    def delivered(self, position: int) -> Any:
        """The batch at `position`, now delivered to the user: it and those before it are no longer kept."""
        batch = self._drawn.pop(position, None)
        while self._kept_from < position:  # batches are delivered in order: this loop runs once, mostly
            self._drawn.pop(self._kept_from, None)
            self._kept_from += 1
        self._kept_from = max(self._kept_from, position + 1)
        return batch

    def skip(self, count: int) -> None:
        """Draw and drop the epoch's first `count` batches (a resume); a UsageError when the epoch has fewer."""
        for position in range(count):
            try:
                self.batch(position)
            except IndexError:
                raise UsageError(
                    f"the state's position {count} is past the end of the epoch, which has {position} batches: "
                    "the sampler draws another epoch than the one saved",
                    hint="load a state_dict() taken from a guarded loader built the same way (dataset, sampler, "
                    "batch size, generators)",
                ) from None
            self.delivered(position)

    def ends_at(self, position: int) -> bool:
        """Whether the epoch is known to have no batch at `position`."""
        end = self.length if self.length is not None else self._ended_at
        return end is not None and position >= end

    def kept(self) -> int:
        """How many batches are drawn and not yet delivered."""
        return len(self._drawn)


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


def _index_sampler(loader: DataLoader) -> Any:
    return loader.batch_sampler if loader.batch_sampler is not None else loader.sampler


def start_epoch(loader: DataLoader, *, draws_base_seed: bool) -> EpochPlan:
    """The next epoch of `loader`: nothing drawn from its sampler yet but the iterator that will draw it.

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
        return EpochPlan(None, length=None, seed_state=seed_state)  # the dataset decides where the epoch ends
    sampler = _index_sampler(loader)
    return EpochPlan(iter(sampler), length=length_or_none(sampler), seed_state=seed_state, states_of=loader)


def replayed(
    loader: DataLoader,
    start_states: dict[str, torch.Tensor],
    global_state: torch.Tensor,
    position: int,
    seed_state: torch.Tensor | None,
) -> EpochPlan:
    """The epoch a saved state was taken in, drawn again from its start up to `position` (those batches
    dropped): the plan's generators are set to `start_states`, which they then leave as the saved run did;
    torch's global generator, which a sampler without its own (a RandomSampler of a loader without a
    generator) draws from, is set to `global_state` while the sampler is iterated up to there, and given back
    to the user's state after."""
    for place, generator in plan_generators(loader).items():
        generator.set_state(start_states[place])
    sampler = _index_sampler(loader)
    users_global = torch.default_generator.get_state()
    torch.default_generator.set_state(global_state)
    try:
        plan = EpochPlan(
            iter(sampler),
            length=length_or_none(sampler),
            seed_state=seed_state,
            start_states=dict(start_states),
            global_state=global_state,
        )
        plan.batch(position)  # the sampler's first draws (a RandomSampler's seed) come from the saved state
        plan.skip(position)
    except IndexError:
        plan.skip(position)  # the epoch ends at `position` exactly, or before it: skip() says which
    finally:
        torch.default_generator.set_state(users_global)
    return plan


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


def generator_states(loader: DataLoader) -> dict[str, torch.Tensor]:
    """The states of plan_generators(loader), by place."""
    return {place: generator.get_state() for place, generator in plan_generators(loader).items()}


class PlannedBatchSampler(Sampler):
    """Yields an epoch plan's batches from `start` on: those not yet delivered. Both may be changed between
    iter() calls, so that a DataLoader with persistent workers can be given each epoch's plan. With a `tag`,
    each batch is handed to `tag(position, batch)` and that is yielded instead (see guard/samples.py)."""

    def __init__(self, plan: EpochPlan | None = None, start: int = 0) -> None:
        self.plan = plan if plan is not None else EpochPlan(None, length=0)
        self.start = start
        self.tag: Any = None

    def replan(self, plan: EpochPlan, start: int = 0, tag: Any = None) -> None:
        if start < 0 or (plan.length is not None and start > plan.length):
            raise ValueError(f"start {start} is outside a plan of {plan.length} batches")
        self.plan, self.start, self.tag = plan, start, tag

    def __iter__(self) -> Iterator[Any]:
        # Bound now: a later replan() does not change an iteration under way.
        return _planned(self.plan, self.start, self.tag)

    def __len__(self) -> int:
        if self.plan.length is None:
            raise TypeError("the sampler of this epoch has no len()")
        return self.plan.length - self.start


def _planned(plan: EpochPlan, start: int, tag: Any) -> Iterator[Any]:
    """The plan's batches from `start` on (each handed to `tag` with its position, when given). One generator,
    not a chain of them: it runs once per batch delivered."""
    position = start
    while True:
        try:
            batch = plan.batch(position)
        except IndexError:
            return
        yield batch if tag is None else tag(position, batch)
        position += 1
