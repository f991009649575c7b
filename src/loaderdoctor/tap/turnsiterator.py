"""TurnsIterator: the ceiling's data-free turns (tap/ceiling.py) from outside a loader loaderdoctor does not tap, one
epoch's iterator at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from loaderdoctor.loader.facts import length_or_none
from loaderdoctor.tap.ceiling import CeilingTurns


class TurnsIterator:
    """An epoch's iterator of batches put through data-free turns, for a loop whose loader loaderdoctor does not
    tap (a guarded loader's epochs, a trainer's loader under a callback): each next() either hands the loop the
    batch it got last, as delivered, or takes the next real one from `inner`, timing its wait. `on_data_free` is
    told of each data-free step (a watch sets it apart from the run's batches)."""

    def __init__(
        self,
        inner: Iterator[Any],
        turns: CeilingTurns,
        epoch: int,
        *,
        on_data_free: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.inner = inner
        self.turns = turns
        self.epoch = epoch
        self.on_data_free = on_data_free
        self.clock = clock
        self.delivered = 0  # real batches of this epoch
        self.data_free = 0  # and data-free ones
        self.length = length_or_none(inner)

    def __iter__(self) -> TurnsIterator:
        return self

    def __next__(self) -> Any:
        turns = self.turns
        if turns.epoch_over(self.delivered, self.data_free, self.length):
            turns.left_epoch(self.clock())
            raise StopIteration
        again = turns.hand_again(self.epoch, self.clock())
        if again is not None:
            self.data_free += 1
            if self.on_data_free is not None:
                self.on_data_free()
            return again
        started = self.clock()
        try:
            batch = next(self.inner)
        except StopIteration:
            turns.left_epoch(started)
            raise
        at = self.clock()
        self.delivered += 1
        turns.delivered(self.epoch, batch, at - started, at, data_free=False, epoch_ends=self.delivered == self.length)
        return batch

    def __getattr__(self, name: str) -> Any:
        own = ("inner", "turns", "epoch", "on_data_free", "clock", "delivered", "data_free", "length")
        if name.startswith("__") or name in own:
            raise AttributeError(name)
        return getattr(self.inner, name)  # the inner iterator's own attributes (len, _workers, ...) read through
