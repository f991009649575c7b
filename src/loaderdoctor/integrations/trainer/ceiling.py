"""The ceiling's data-free turns (tap/ceiling.py) for a trainer's train loader under a callback: the loader's epochs
go through TurnsIterator by way of a stand-in for the loader, and the trainer's step hooks learn which of the
batches they step on were handed again, so that those steps are set aside from the run's batches."""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from loaderdoctor.errors import UsageError
from loaderdoctor.loader.settings import LoaderSpec
from loaderdoctor.tap.ceiling import CeilingMeasured, CeilingTurns, ceiling_steps, ceiling_turns
from loaderdoctor.tap.iterator import shutdown
from loaderdoctor.tap.turnsiterator import TurnsIterator


def ceiling_option(ceiling: Any, ceiling_only: Any) -> int | bool | None:
    """The data-free steps a callback's `ceiling=` asks for (as ceiling_steps: False, None for the default, or a
    number); raises UsageError for a bad option, or `ceiling_only` without a ceiling."""
    steps = ceiling_steps(ceiling)
    if not isinstance(ceiling_only, bool):
        raise UsageError(f"ceiling_only must be True or False, not {ceiling_only!r}")
    if ceiling_only and steps is False:
        raise UsageError("ceiling_only=True needs ceiling=True (or a number of steps)")
    return steps


class TrainerCeiling:
    """The turns of one trainer's train loader, kept across its epochs, and which of the batches delivered and not
    yet stepped on were data-free (a trainer may fetch ahead of its step hooks). `on_measured` is called once the
    turns end the run (ceiling_only), before CeilingMeasured goes up through the trainer. `batches_per_delivery`:
    the loader's batches in one batch the trainer gets (accelerate's dispatcher concatenates one per process)."""

    def __init__(
        self,
        loader: Any,
        steps: int | None,
        *,
        stop_when_done: bool,
        on_measured: Callable[[], None] | None = None,
        batches_per_delivery: int = 1,
    ) -> None:
        settings = LoaderSpec.from_loader(loader).settings
        self.loader = loader
        self.turns: CeilingTurns = ceiling_turns(
            steps,
            settings,
            stop_when_done=stop_when_done,
            check_schedules=False,
            batches_per_delivery=batches_per_delivery,
        )
        self.on_measured = on_measured
        self.pending: deque[bool] = deque()  # per batch delivered and not yet stepped on: whether data-free
        self.epoch = -1
        self._data_free = False

    def iterator(self, inner: Iterator[Any], *, fetched_before: int = 0) -> Iterator[Any]:
        """The next epoch's iterator of batches, through the turns; `fetched_before` batches of it were already
        taken from `inner` by the trainer (real ones, not through the turns)."""
        self.epoch += 1
        self.pending.clear()
        self.pending.extend([False] * fetched_before)
        return _Flagged(inner, self)

    def stepped(self, count: int = 1) -> int:
        """The trainer stepped on its next `count` batches: how many of them were data-free."""
        free = 0
        for _ in range(count):
            if self.pending and self.pending.popleft():
                free += 1
        return free

    def epoch_ended(self) -> None:
        """The trainer left its epoch: a batch it fetched ahead and never stepped on, if handed again, is no
        data-free step (Ceiling.data_free_steps counts those trained on)."""
        self.turns.ceiling.data_free_steps -= sum(self.pending)
        self.pending.clear()

    def data_free_ahead(self, real: int) -> int:
        """How many data-free batches the turns hand the loop, from the next delivery on, before `real` real ones
        have come (a trainer whose epoch has a fixed number of batches lengthens it by as many)."""
        turns = self.turns
        step, free, left = turns.step, 0, real
        while left > 0 and step < turns.end:
            if turns.kind_at(step) == "data-free":
                free += 1
            else:
                left -= 1
            step += 1
        return free


class _Flagged(TurnsIterator):
    """An epoch's TurnsIterator that notes each delivery's kind for the step hooks, and on the turns' end of a
    ceiling_only run lets the loader's workers go and tells the callback before the exit goes up."""

    def __init__(self, inner: Iterator[Any], owner: TrainerCeiling) -> None:
        super().__init__(inner, owner.turns, owner.epoch, on_data_free=self._data_free)
        self.owner = owner
        self.was_data_free = False

    def _data_free(self) -> None:
        self.was_data_free = True

    def __next__(self) -> Any:
        self.was_data_free = False
        try:
            batch = super().__next__()
        except CeilingMeasured:
            loader = self.owner.loader  # the run ends here: its workers with it
            if inspect.isgenerator(self.inner):  # accelerate's dispatcher's epoch, which holds the loader's iterator
                self.inner.close()
                shutdown(loader, getattr(loader, "_iterator", None))  # persistent workers outlive the epoch
            else:
                shutdown(loader, self.inner)
            if self.owner.on_measured is not None:
                self.owner.on_measured()
            raise
        self.owner.pending.append(self.was_data_free)
        return batch

    def __getattr__(self, name: str) -> Any:
        if name in ("owner", "was_data_free"):
            raise AttributeError(name)
        return super().__getattr__(name)


class TurnsLoader:
    """A trainer's train DataLoader seen through the ceiling's turns, put where the trainer takes its loader from:
    iter() gives the epoch's batches through the turns, len() the loader's (plus `extra`, the data-free batches
    of the epoch under way when the trainer counts an epoch's batches), and everything else reads through to the
    loader, its class too (isinstance(x, DataLoader) holds, as for accelerate's wrappers)."""

    def __init__(self, loader: Any, ceiling: TrainerCeiling) -> None:
        self.loader = loader
        self.ceiling = ceiling
        self.extra = 0

    def __iter__(self) -> Iterator[Any]:
        return self.ceiling.iterator(iter(self.loader))

    def __len__(self) -> int:
        return len(self.loader) + self.extra

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return self.loader.__class__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.loader, name, value)  # a trainer's reset of the loader (its _iterator) is the loader's


_OWN = ("loader", "ceiling", "extra")
