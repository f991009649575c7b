"""Data-free turns (`run --ceiling`): for a few turns a watched loader hands the loop the batch it delivered last,
kept as delivered, instead of a new one, so that the loop's rate with its input taken away is measured beside its
real rate, in turns (real, data-free, real, ...) so that drift cancels; the real stream then goes on where it
stopped, no sample skipped or repeated.

The turns are counted in the loader's deliveries, so that ranks of one job, whose loops meet in collectives at
the same steps, switch together. A turn's time is the loop's time from one delivery to the next (the step on a
batch and the fetch of the one after), within one epoch's iterator. A real turn after a data-free one leaves out
its first deliveries: the workers filled their prefetch queue while the loop trained on repeated batches, and
those batches come at once; a data-free turn after a real one leaves out as many (at most half of it), while the
workers, still filling their queue, take CPU from the step. A loader the tap does not iterate goes through the same
turns by way of tap/turnsiterator.py."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.errors import UsageError
from loaderdoctor.host.accelerator import wait_for_devices
from loaderdoctor.loader.settings import Settings
from loaderdoctor.tap.schedules import live_raising_schedule

DEFAULT_STEPS = 60  # data-free steps when the user names none: three turns of 20
MIN_TURN_STEPS = 5  # the fewest intervals a turn measures


@dataclass
class Turn:
    """One turn of the loop, real or data-free: the intervals it measured and their time."""

    kind: str  # "real" or "data-free"
    deliveries: int = 0  # planned: the loader's (or the handed-again) batches this turn takes
    intervals: int = 0  # delivery-to-delivery intervals measured (within one iterator, past a real turn's refill)
    seconds: float = 0.0
    wait_s: float = 0.0  # of those seconds, the time in next() (about 0 in a data-free turn)


@dataclass
class Ceiling:
    """What the data-free turns measured: plain data, kept in the Recording. The loop trained on
    `data_free_steps` repeated batches (the JSON says so, and the report)."""

    data_free_steps: int  # batches handed again in the data-free turns, each trained on by the loop
    refill: int  # deliveries left out at the start of a turn that follows another (see CeilingTurns._settling)
    turns: list[Turn] = field(default_factory=list)
    trained_on_repeated_batches: bool = True
    # why an epoch with data-free steps kept its length (a schedule that raises past its planned steps), or None
    kept_length: str | None = None

    def rate(self, kind: str) -> float | None:
        """Batches per second of the loop over the turns of `kind` ("real" or "data-free"), None before both a
        turn of it was measured."""
        intervals = sum(t.intervals for t in self.turns if t.kind == kind)
        seconds = sum(t.seconds for t in self.turns if t.kind == kind)
        return intervals / seconds if intervals and seconds > 0 else None

    @property
    def speedup(self) -> float | None:
        """The data-free rate over the real one: how much faster the job runs with a perfect input."""
        real, free = self.rate("real"), self.rate("data-free")
        return free / real if real and free else None

    @property
    def input_cost(self) -> float | None:
        """The share of the real loop's time its input costs, measured: 1 - real rate / data-free rate (0 when
        the data-free turns were no faster)."""
        speedup = self.speedup
        return None if speedup is None else max(0.0, 1.0 - 1.0 / speedup)

    @property
    def wait_estimate(self) -> float | None:
        """What the wait model reads over the same real turns: their time in next() over their time."""
        seconds = sum(t.seconds for t in self.turns if t.kind == "real")
        waits = sum(t.wait_s for t in self.turns if t.kind == "real")
        return waits / seconds if seconds > 0 else None

    @property
    def complete(self) -> bool:
        """Whether every turn of the plan measured something (the run went on long enough)."""
        return bool(self.turns) and all(t.intervals for t in self.turns)

    def pair_costs(self) -> list[float]:
        """The input's cost as each pair of turns measured it (see input_cost and pair_speedups)."""
        return [max(0.0, 1.0 - 1.0 / p) for p in self.pair_speedups() if p > 0]

    def pair_speedups(self) -> list[float]:
        """Each data-free turn's rate over the mean of the real turns beside it: the spread of the measurement."""
        ratios = []
        for n, turn in enumerate(self.turns):
            if turn.kind != "data-free" or not turn.intervals:
                continue
            beside = [t for t in (self.turns[n - 1], self.turns[n + 1] if n + 1 < len(self.turns) else None) if t]
            real = [t.intervals / t.seconds for t in beside if t.kind == "real" and t.intervals and t.seconds > 0]
            if real and turn.seconds > 0:
                ratios.append((turn.intervals / turn.seconds) / (sum(real) / len(real)))
        return ratios


def turn_plan(
    steps: int | None, *, num_workers: int, prefetch_factor: int | None, batches_per_delivery: int = 1
) -> Ceiling:
    """The plan of turns for `steps` data-free steps in all (DEFAULT_STEPS when None): three data-free turns that
    share them between four real ones, each real turn as long as a data-free one and long enough to measure
    MIN_TURN_STEPS past its refill (the batches the workers had ready, in deliveries of `batches_per_delivery` of
    the loader's batches each: accelerate's dispatcher concatenates one per process)."""
    refill = -(-num_workers * (prefetch_factor or 2) // batches_per_delivery) if num_workers else 0
    total = DEFAULT_STEPS if steps is None else steps
    free = [total // 3 + (1 if n < total % 3 else 0) for n in range(3)]
    real = max(MIN_TURN_STEPS, max(free)) + refill
    turns = [Turn("data-free", free[n // 2]) if n % 2 else Turn("real", real) for n in range(7)]
    return Ceiling(data_free_steps=0, refill=refill, turns=turns)


class CeilingMeasured(BaseException):
    """Raised by next() once the turns are done, when the run was asked to stop there (`run --ceiling-only`,
    `ceiling_only=True`); not an Exception, so that no `except Exception` of the loop carries on. In a script it is
    a CeilingExit, an exit of status 0. In IPython (a notebook), where a SystemExit shows as a failure with a hint to
    quit the shell, it is this, and the cell ends on one line that says why."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows of it, in place of a traceback."""
        return ["CeilingMeasured: the loop was ended once its ceiling was measured (ceiling_only); see its report"]


class CeilingExit(CeilingMeasured, SystemExit):
    """CeilingMeasured in a script: an exit of status 0, so that the script's own clean-up runs and the summary
    follows."""

    def __init__(self) -> None:
        SystemExit.__init__(self, 0)


def ceiling_measured() -> CeilingMeasured:
    """What next() raises once the turns are done and the run stops there: a CeilingExit, or in IPython a plain
    CeilingMeasured."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", None)
    return CeilingMeasured() if callable(shell) and shell() is not None else CeilingExit()


class CeilingTurns:
    """The turns of one loader, kept across its epochs by its tap: which deliveries are data-free, the batch to
    hand again, and each turn's time. `start_after` deliveries (the first epoch's start-up and a few steady
    batches) go by before the first turn."""

    def __init__(
        self,
        ceiling: Ceiling,
        start_after: int,
        *,
        stop_when_done: bool = False,
        check_schedules: bool = False,
        wait_for_device: Callable[[], bool] = wait_for_devices,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.ceiling = ceiling
        self.start_after = start_after
        self.stop_when_done = stop_when_done
        # whether to look, as the turns begin, for a schedule that raises past its planned steps (tap/schedules.py):
        # where one is alive, an epoch with data-free steps keeps its length (not when the run ends after the turns)
        self.check_schedules = check_schedules and not stop_when_done
        self.keep_length = False
        self.wait_for_device = wait_for_device  # waits for an asynchronous device's queued work; True if it did
        self.clock = clock  # read again after such a wait: the caller's clock, perf_counter's
        self.step = 0  # deliveries so far, real and data-free
        self._planned = sum(turn.deliveries for turn in ceiling.turns)  # the turns' deliveries in all
        self._last_batch: Any = None
        self._last_at: float | None = None
        self._last_epoch: int | None = None
        self._ended_in_step = False  # whether the last delivery was its epoch's last, known from its length

    def _turn(self, step: int) -> tuple[int, int] | None:
        """The turn number of a delivery and its place in the turn; None outside the turns."""
        place = step - self.start_after
        if place < 0 or place >= self._planned:
            return None  # before the turns, or past them: most of a long run's deliveries, at once
        for number, turn in enumerate(self.ceiling.turns):
            if place < turn.deliveries:
                return number, place
            place -= turn.deliveries
        return None

    def kind_at(self, step: int) -> str | None:
        """The kind of the turn delivery `step` (counted from the loader's first) falls in, None outside the
        turns."""
        turn = self._turn(step)
        return None if turn is None else self.ceiling.turns[turn[0]].kind

    @property
    def end(self) -> int:
        """The delivery after the turns' last one."""
        return self.start_after + self._planned

    @property
    def done(self) -> bool:
        """Whether every turn has gone by."""
        return self.step >= self.end

    def hand_again(self, epoch: int, at: float) -> Any:
        """At a next() of `epoch` at clock time `at`: the batch handed to the loop again, its delivery counted, or
        None (the real loader's turn: the caller fetches, then calls delivered()). Raises CeilingMeasured past
        the turns when the run stops there."""
        again = self.replay()
        if again is not None:
            self.delivered(epoch, again, 0.0, at, data_free=True)
        return again

    def replay(self) -> Any:
        """The batch to hand the loop at this next() instead of a new one, or None (the real loader's turn).
        Raises CeilingMeasured past the turns when the run stops there."""
        if self.stop_when_done and self.done:
            logging.getLogger("loaderdoctor").warning(
                "the ceiling is measured (%d data-free steps): the run ends here",
                self.ceiling.data_free_steps,
            )
            raise ceiling_measured()
        turn = self._turn(self.step)
        if turn is None or self.ceiling.turns[turn[0]].kind != "data-free":
            return None
        return self._last_batch

    def delivered(
        self, epoch: int, batch: Any, wait_s: float, at: float, *, data_free: bool, epoch_ends: bool = False
    ) -> None:
        """A batch reached the loop at `at` after `wait_s` in next(): a real one, or one handed again;
        `epoch_ends` when it is the epoch's last, as the loader's length tells."""
        if self.check_schedules and self.step == self.start_after - 1:  # the last delivery before the turns
            self.check_schedules = False
            found = live_raising_schedule()
            if found is not None:
                self.keep_length = True
                self.ceiling.kept_length = f"the loop's {found}"
                logging.getLogger("loaderdoctor").warning(
                    "the loop's %s: an epoch with data-free steps keeps its length, the data-free "
                    "steps taking the place of its last real batches",
                    found,
                )
            at = self.clock()  # the next interval starts after the search
        measured, after = self._measured_turn(self.step), self._measured_turn(self.step + 1)
        edge = measured != after or (after is not None and self._last_epoch != epoch)
        if (edge or (measured is not None and epoch_ends)) and self.wait_for_device():
            at = self.clock()  # a measured span begins or ends here: its time holds the work queued so far
        self._ended_in_step = epoch_ends
        if measured is not None and self._last_epoch == epoch and self._last_at is not None:
            turn = self.ceiling.turns[measured]
            turn.intervals += 1
            turn.seconds += at - self._last_at
            turn.wait_s += wait_s
        if data_free:
            self.ceiling.data_free_steps += 1
        self.step += 1
        # The batch is held only while a data-free turn may still come: then let go of it.
        self._last_batch = batch if self._turn(self.step) is not None else None
        self._last_at, self._last_epoch = at, epoch

    def epoch_over(self, delivered: int, data_free: int, length: int | None) -> bool:
        """Whether an epoch that keeps its length (`keep_length`) is over: its `delivered` real batches and
        `data_free` data-free ones make the `length` the loader has. Where the length is unknown (an
        IterableDataset), never: a warning says, once, that the schedule may then be stepped past its end."""
        if not self.keep_length or data_free == 0:
            return False
        if length is None:
            if self.ceiling.kept_length is not None:  # said once; the JSON then says no epoch kept its length
                logging.getLogger("loaderdoctor").warning(
                    "%s, but the loader's epochs have no known length to keep: the data-free steps add "
                    "to the loop's steps, and may step it past its end (measure such a job with --ceiling-only)",
                    self.ceiling.kept_length,
                )
                self.ceiling.kept_length = None
            return False
        return delivered + data_free >= length

    def _measured_turn(self, step: int) -> int | None:
        """The number of the turn that measures the interval ending at delivery `step` (within one epoch), None
        when no turn does: every interval of the first turn, and in a turn after another, those past its
        settling."""
        turn = self._turn(step)
        if turn is None:
            return None
        number, place = turn
        return number if number == 0 or place >= self._settling(self.ceiling.turns[number]) else None

    def _settling(self, turn: Turn) -> int:
        """The first deliveries of a turn after the one before it, left out: in a real turn, the batches the workers
        had ready (they kept loading while the loop trained on repeated ones); in a data-free turn, as many, at
        most half the turn, while the workers still fill their queue and take CPU from the step."""
        if turn.kind == "real":
            return self.ceiling.refill
        return min(self.ceiling.refill, turn.deliveries // 2)

    def left_epoch(self, at: float | None = None) -> None:
        """The epoch ended (or its iterator was dropped), the loop asking for a batch more at `at`: no interval runs
        across into the next one. Where the epoch's length was not known, its last delivery was no edge of the
        measured span: on an asynchronous device, the work queued since is waited for and counted here, as one
        interval more (the epoch's last step, which has no wait)."""
        measured = self._measured_turn(self.step)
        if (
            at is not None
            and measured is not None
            and self._last_at is not None
            and self._last_epoch is not None
            and not self._ended_in_step
            and self.wait_for_device()
        ):
            turn = self.ceiling.turns[measured]
            turn.intervals += 1
            turn.seconds += self.clock() - self._last_at
        self._last_epoch = None


def ceiling_steps(ceiling: Any) -> int | bool | None:
    """The data-free steps asked for: False for none, None for the default number, else the number."""
    if ceiling is False:
        return False
    if ceiling is True:
        return None
    if isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 3:
        raise UsageError(f"ceiling must be True or a number of steps, 3 or more, not {ceiling!r}")
    return ceiling


def ceiling_turns(
    steps: int | None,
    settings: Settings,
    *,
    stop_when_done: bool = False,
    check_schedules: bool = True,
    batches_per_delivery: int = 1,
) -> CeilingTurns:
    """The data-free turns of a loader with these settings: they start once the first epoch's workers have each
    delivered a batch and a few steady ones came, the same step on every rank of a job. `check_schedules`: look for
    a schedule that raises past its planned steps as they begin (a trainer's callback looks at the trainer's own).
    `batches_per_delivery`: the loader's batches that make one delivery to the loop (see turn_plan)."""
    plan = turn_plan(
        steps,
        num_workers=settings.num_workers,
        prefetch_factor=settings.prefetch_factor,
        batches_per_delivery=batches_per_delivery,
    )
    start_after = max(1, settings.num_workers) + MIN_TURN_STEPS
    return CeilingTurns(plan, start_after, stop_when_done=stop_when_done, check_schedules=check_schedules)
