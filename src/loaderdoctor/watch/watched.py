"""watch(): a DataLoader (plain or guarded) observed in the user's own training loop, diagnosed at its end."""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.loader import GuardedLoader
from loaderdoctor.host.snapshot import HostSnapshot
from loaderdoctor.loader.facts import MAX_DRAWN
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.report import LoaderReport
from loaderdoctor.tap.ceiling import CeilingTurns, ceiling_steps, ceiling_turns
from loaderdoctor.tap.events import DataFreeBatch
from loaderdoctor.tap.iterator import Tap
from loaderdoctor.tap.turnsiterator import TurnsIterator
from loaderdoctor.watch.watchrun import WatchRun

log = logging.getLogger("loaderdoctor")

DEFAULT_LOG_EVERY_S = 60.0


def watch(
    loader: DataLoader | GuardedLoader,
    name: str | None = None,
    *,
    epochs: int | None = None,
    cost_per_hour: float | None = None,
    history: bool = True,
    log_every_s: float = DEFAULT_LOG_EVERY_S,
    ceiling: bool | int = False,
    ceiling_only: bool = False,
) -> WatchedLoader:
    """`loader`, observed in the training loop that iterates it (`for batch in watch(loader): ...`): per batch
    the wait in next() and the step after it, per epoch its start-up and rate, the workers' memory and CPU in
    the background. Every `log_every_s` and at each epoch's end one line goes to the "loaderdoctor" logger (rate,
    wait share, ETA of the epoch and, with `epochs`, of the run; with `cost_per_hour`, what the wait costs).
    close() (or the end of a `with` block, garbage collection, or the interpreter's exit, whichever comes first)
    runs check's rules on what was measured, logs the diagnosis, and saves the run in the history (unless
    `history` is False). `name` (default: the file and line of this call) is what runs are compared by; in a
    distributed run each rank's is its own ("train/rank1"), and with a ceiling, at close() each rank hands its
    ceiling to rank 0, whose diagnosis has the job's (job-ceiling): every rank must watch with a ceiling, and rank 0
    waits for the others' at most a minute.

    `ceiling` (True, or a number of steps; off by default) measures what the loop runs at with its input taken
    away: after the first epoch's start-up, for that many steps in turns (DEFAULT_STEPS with True) the loop is
    handed the batch it got last instead of a new one, then the loader goes on where it stopped. Those steps
    train on repeated batches: use it on a diagnostic run (see the README). With `ceiling_only`, the loop's next()
    ends it once the turns are done, by SystemExit(0) (loaderdoctor.tap.ceiling.CeilingExit; in a notebook,
    CeilingMeasured: one line, no traceback)."""
    if name is None:
        caller = sys._getframe(1)
        name = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
    if isinstance(name, str) and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        name = f"{name}/rank{dist.get_rank()}"
    return WatchedLoader(
        loader,
        name,
        epochs=epochs,
        cost_per_hour=cost_per_hour,
        history=history,
        log_every_s=log_every_s,
        ceiling=ceiling,
        ceiling_only=ceiling_only,
    )


def _check_options(loader: Any, name: str, epochs: Any, cost_per_hour: Any, log_every_s: Any) -> None:
    if not isinstance(loader, (DataLoader, GuardedLoader)):
        kind = f"{type(loader).__module__}.{type(loader).__name__}"
        raise UsageError(
            f"watch() expects a torch.utils.data.DataLoader or a loaderdoctor.DataLoader, got {kind}",
            hint="pass the DataLoader itself: watch(loader), then iterate what watch() returns",
        )
    if not isinstance(name, str) or not name:
        raise UsageError(f"watch()'s name must be a non-empty string, not {name!r}")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise UsageError(f"epochs must be a whole number, 1 or more, not {epochs!r}")
    for option, value in (("cost_per_hour", cost_per_hour), ("log_every_s", log_every_s)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise UsageError(f"{option} must be a number, 0 or more, not {value!r}")
    if not log_every_s:
        raise UsageError("log_every_s must be more than 0 seconds")


class WatchedLoader:
    """Iterates as the loader it watches, batch for batch (its attributes read through); see watch()."""

    def __init__(
        self,
        loader: DataLoader | GuardedLoader,
        name: str,
        *,
        epochs: int | None = None,
        cost_per_hour: float | None = None,
        history: bool = True,
        log_every_s: float = DEFAULT_LOG_EVERY_S,
        open_iterator: Callable[[DataLoader], Any] = iter,
        log_diagnosis: bool = True,
        ceiling: bool | int = False,
        ceiling_only: bool = False,
        meet_ranks: bool = True,
    ) -> None:
        _check_options(loader, name, epochs, cost_per_hour, log_every_s)
        steps = ceiling_steps(ceiling)
        self.loader = loader
        self.name = name
        self._epoch = -1
        guarded = loader if isinstance(loader, GuardedLoader) else None
        user_loader = guarded.loader if guarded is not None else loader
        if guarded is not None:
            self._tap = None
            settings: Callable[[], Settings] = lambda: guarded.settings  # noqa: E731
            waiting: Callable[[], float | None] = lambda: None  # noqa: E731
            inner: Callable[[], Any] = guarded.torch_iterator
            held: Callable[[int], int | None] = guarded.held
        else:
            fixed = LoaderSpec.from_loader(loader).settings
            settings = lambda: fixed  # noqa: E731
            tap = self._tap = Tap(loader, [], start_method=fixed.effective_start_method, open_iterator=open_iterator)
            if not tap.fingerprints:  # a map-style dataset: the indices its first epoch draws, for run's ranks
                tap.draws_to_note = MAX_DRAWN
            waiting = lambda: getattr(tap.current, "waiting_since", None)  # noqa: E731
            inner = tap.torch_iterator
            held = tap.held
        self._run = WatchRun(
            name,
            self._tap.listeners if self._tap is not None else guarded.listeners,  # type: ignore[union-attr]
            user_loader,
            settings,
            epochs=epochs,
            cost_per_hour=cost_per_hour,
            history=history,
            log_every_s=float(log_every_s),
            waiting_since=waiting,
            torch_iterator=inner,
            held=held,
            log_diagnosis=log_diagnosis,
        )
        self._run.listeners.append(self._run.on_event)
        # A guarded loader's epochs go through the turns outside the guard, which never sees a data-free step:
        # its batch plan, checkpoints and restarts count the real batches only.
        self._turns: CeilingTurns | None = None
        if steps is not False:
            self._turns = ceiling_turns(steps, settings(), stop_when_done=ceiling_only)
            if self._tap is not None:
                self._tap.ceiling = self._turns
            self._run.recorder.rec.ceiling = self._turns.ceiling  # filled in as the turns go by
            if meet_ranks:  # in a distributed run the ranks meet at the end, for the job's ceiling
                self._run.ceiling = self._turns.ceiling
        self._finalizer = weakref.finalize(self, self._run.close)

    def __iter__(self) -> Iterator[Any]:
        if not self._finalizer.alive:
            raise UsageError(
                f"the watch '{self.name}' was closed: its run is diagnosed and kept",
                hint="call watch(loader) again to watch a new run",
            )
        self._run.start()
        self._epoch += 1
        if self._tap is not None:
            tap = self._tap
            if tap.in_hand is None and tap.loader.num_workers > 0 and not tap.fingerprints:  # map-style, workers
                tap.in_hand = self._run.in_hand_slots(tap.loader.num_workers)
                tap.note_in_workers = tap.in_hand is not None
            return tap.epoch(self._epoch)
        if self._turns is None:
            return iter(self.loader)
        epoch, listeners = self._epoch, self._run.listeners

        def data_free() -> None:
            for listener in listeners:
                listener(DataFreeBatch(epoch))

        return TurnsIterator(iter(self.loader), self._turns, epoch, on_data_free=data_free)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("loader", "_run", "_tap", "_turns", "_finalizer"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    @property
    def report(self) -> LoaderReport | None:
        """The diagnosis, once closed."""
        return self._run.report

    @property
    def started_at(self) -> str:
        """When the watch began (ISO 8601)."""
        return self._run.started_at

    @property
    def snapshot(self) -> HostSnapshot:
        """The host and this process when the watch began."""
        return self._run.snapshot

    def report_so_far(self) -> LoaderReport | None:
        """The diagnosis of the run so far, the watch going on (see WatchRun.report_so_far)."""
        return self._run.report_so_far()

    def when_an_epoch_ends(self, call: Callable[[], None]) -> None:
        """Have `call` called (in the loop's thread) after each epoch's end is recorded."""
        self._run.epoch_ended = call

    def close(self) -> LoaderReport | None:
        """End the watch: diagnose the run so far, log it, keep it in the history. Safe to call again."""
        if self._finalizer.alive:
            return self._finalizer()
        return self._run.report

    def __enter__(self) -> WatchedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
