"""The ceiling's data-free turns (tap/ceiling.py) for a Trainer's train loader that accelerate dispatches: its
DataLoaderDispatcher (an IterableDataset's loader on several processes, or dispatch_batches=True) iterates the
DataLoader on the main process alone, concatenates one of its batches per process into each step's batch (one with
split_batches), broadcasts it, and gives each process its slice.

The turns are counted in the dispatcher's batches, on every process, from the Trainer's step hooks. On the main
process the dispatcher iterates a TurnsLoader, which hands it the DataLoader's last real batch again for each fetch
that makes a data-free step's batch: every process trains on repeated batches at the same steps, and follows the
same plan. The dispatcher fetches a batch ahead (at an epoch's start, two): the wait before a step's start hook holds
the fetch of the batch after it, so the turns see the dispatcher's batches arrive at the step hooks' starts, one
ahead of the batches stepped on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from loaderdoctor.loader.settings import LoaderSpec
from loaderdoctor.tap.ceiling import CeilingTurns, ceiling_turns


def dispatched_batches(loader: Any) -> int | None:
    """How many batches of the DataLoader that accelerate's DataLoaderDispatcher `loader` wraps make one of its
    batches (one per process; one with split_batches); None when `loader` is no dispatcher."""
    try:
        from accelerate.data_loader import DataLoaderDispatcher
    except ImportError:  # pragma: no cover - the Trainer needs accelerate
        return None
    if not issubclass(type(loader), DataLoaderDispatcher):
        return None
    if loader.split_batches or getattr(loader, "submesh_tp", None) is not None:
        return 1
    return max(1, int(loader.state.num_processes))


def dispatching_process(loader: Any) -> bool:
    """Whether this process is the one where accelerate's dispatcher `loader` iterates its DataLoader."""
    return int(loader.state.process_index) == 0


class DispatchedCeiling:
    """The turns of a dispatched train loader on one process, counted in the dispatcher's batches and timed from the
    Trainer's step hooks (see the module). `on_measured` is called once the turns end the run (ceiling_only), before
    CeilingMeasured goes up through the Trainer, at the same step on every process."""

    def __init__(
        self,
        loader: Any,
        steps: int | None,
        *,
        batches_per_step: int,
        stop_when_done: bool,
        on_measured: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        settings = LoaderSpec.from_loader(loader).settings
        self.turns: CeilingTurns = ceiling_turns(
            steps, settings, check_schedules=False, batches_per_delivery=batches_per_step
        )
        self.batches_per_step = batches_per_step
        self.stop_when_done = stop_when_done
        self.on_measured = on_measured
        self.clock = clock
        self.stepped_batches = 0  # the dispatcher's batches the Trainer stepped on, all epochs
        self.epoch = -1
        self.epoch_first = 0  # stepped_batches when the epoch began
        self.idle_from: float | None = None  # the last step's end, or the epoch's start
        self.last_batch: Any = None  # the main process's last real DataLoader batch, while a data-free turn may come
        self.iterator_in_use: Iterator[Any] | None = None  # the main process's DataLoader iterator (its workers)

    # The main process: the DataLoader's batches

    def iterator(self, inner: Iterator[Any]) -> Iterator[Any]:
        """The epoch's iterator of DataLoader batches the dispatcher takes (TurnsLoader's iter())."""
        self.iterator_in_use = inner
        return _Dispatching(inner, self, first=self.stepped_batches)

    # Every process: the step hooks

    def epoch_started(self) -> None:
        """The Trainer begins an epoch: the dispatcher's first batch of it is the one after those stepped on (the
        fetch ahead that found the last epoch's end fetched nothing)."""
        self.epoch += 1
        self.turns.step = self.epoch_first = self.stepped_batches
        self.turns.left_epoch()
        self.idle_from = self.clock()

    def step_started(self, batches: int) -> None:
        """The Trainer's start hook of a step on `batches` of the dispatcher's batches (its gradient accumulation
        steps): those and the one after them were fetched by now. At an epoch's first step they came in one go
        after the epoch's start: no interval of the turns ends there."""
        now = self.clock()
        wait = max(0.0, now - self.idle_from) if self.idle_from is not None else 0.0
        first_step = self.stepped_batches == self.epoch_first
        for n in range(max(0, self.stepped_batches + batches + 1 - self.turns.step)):
            self.turns.delivered(self.epoch, None, wait if n == 0 else 0.0, now, replayed=False, timed=not first_step)

    def stepped(self, count: int) -> int:
        """The Trainer stepped on `count` of the dispatcher's batches: how many of them were data-free (the same on
        every process)."""
        turns = self.turns
        free = sum(turns.kind_at(self.stepped_batches + n) == "data-free" for n in range(count))
        self.stepped_batches += count
        turns.ceiling.data_free_steps += free
        self.idle_from = self.clock()
        return free

    def end_if_measured(self) -> None:
        """With stop_when_done, once the turns' last batch was stepped on: the DataLoader's workers let go, the
        callback told, and CeilingMeasured raised (every process at the same step)."""
        if not self.stop_when_done or self.stepped_batches < self.turns.end:
            return
        shutdown = getattr(self.iterator_in_use, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        if self.on_measured is not None:
            self.on_measured()
        raise self.turns.run_ends()


class _Dispatching:
    """An epoch's iterator of the DataLoader's batches as the main process's dispatcher takes them: a fetch that
    makes a data-free step's batch gets the last real batch again, and the real stream goes on where it stopped."""

    def __init__(self, inner: Iterator[Any], owner: DispatchedCeiling, *, first: int) -> None:
        self.inner = inner
        self.owner = owner
        self.first = first  # the dispatcher's batches before this epoch's
        self.fetched = 0

    def __iter__(self) -> _Dispatching:
        return self

    def __next__(self) -> Any:
        owner = self.owner
        step = self.first + self.fetched // owner.batches_per_step
        if owner.turns.kind_at(step) == "data-free" and owner.last_batch is not None:
            self.fetched += 1
            return owner.last_batch
        batch = next(self.inner)
        self.fetched += 1
        owner.last_batch = batch if step < owner.turns.end else None  # held while a data-free turn may come
        return batch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("inner", "owner", "first", "fetched"):
            raise AttributeError(name)
        return getattr(self.inner, name)  # the DataLoader iterator's own attributes read through
