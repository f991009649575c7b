"""How the benchmarks time what they compare: a plain loop's rate, rounds in turns, and the median of per-round
ratios (the method the README gives for tune: each round's figure over the same round's baseline, so that the
machine's faster and slower minutes cancel)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

T = TypeVar("T")
# How the contenders take turns from one round to the next: "reverse", the order reversed every other round;
# "rotate", the order turned by one every round (each contender first in its turn); "same", one order throughout.
Order = Literal["reverse", "rotate", "same"]


def loop_rate(
    loader: Iterable[Any],
    step: Callable[[Any], object] | None = None,
    *,
    epochs: int = 1,
    warm_up: int = 0,
    seconds: float | None = None,
    end: Callable[[], object] | None = None,
) -> float:
    """Batches per second of a plain training loop over `loader`: `warm_up` epochs untimed, then `epochs` whole
    epochs timed (or, with `seconds`, whole epochs until that long has passed), `step` after each batch; each timed
    epoch's iter() and start-up counted, and `end` (called after the last epoch) too."""
    for _ in range(warm_up):
        for batch in loader:
            if step is not None:
                step(batch)
    batches, epoch, started = 0, 0, time.perf_counter()
    while (epoch < epochs) if seconds is None else (time.perf_counter() - started < seconds):
        if step is None:
            for _ in loader:
                batches += 1
        else:
            for batch in loader:
                step(batch)
                batches += 1
        epoch += 1
    if end is not None:
        end()
    return batches / (time.perf_counter() - started)


def turn_order(names: Sequence[str], number: int, order: Order = "reverse") -> list[str]:
    """The contenders' order in round `number` (from 0)."""
    if order == "reverse":
        return list(names) if number % 2 == 0 else list(reversed(names))
    if order == "rotate":
        shift = number % len(names) if names else 0
        return list(names[shift:]) + list(names[:shift])
    return list(names)


def in_turns(
    contenders: Mapping[str, Callable[[], T]], rounds: int, order: Order = "reverse"
) -> Iterator[dict[str, T]]:
    """Each round's figure of every contender (keyed by name, in the contenders' own order), the contenders measured
    one after another in the round's turn order, so that a drift on the machine favours none."""
    for number in range(rounds):
        figures = {name: contenders[name]() for name in turn_order(list(contenders), number, order)}
        yield {name: figures[name] for name in contenders}


def per_round_ratios(rounds: Iterable[Mapping[str, Any]], name: str, baseline: str) -> list[float]:
    """Each round's figure of `name` over the same round's `baseline`, for the rounds that measured both."""
    return [r[name] / r[baseline] for r in rounds if r.get(name) is not None and r.get(baseline)]


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are there, or None when none is."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_ratio(rounds: Iterable[Mapping[str, Any]], name: str, baseline: str) -> float | None:
    """The median of the per-round ratios of `name` to `baseline` (None when no round measured both)."""
    return median(per_round_ratios(rounds, name, baseline))


def side_by_side(plain: Callable[[], float], other: Callable[[], float], rounds: int) -> tuple[float, float, float]:
    """A plain loop's rate against another's (the same loop, wrapped or watched), `rounds` rounds in turns: the
    median rate of each and the median of the per-round ratios other/plain."""
    measured = list(in_turns({"plain": plain, "other": other}, rounds))
    ratio = median_ratio(measured, "other", "plain")
    return statistics.median(r["plain"] for r in measured), statistics.median(r["other"] for r in measured), ratio


def input_cost(real: float, data_free: float) -> float:
    """The input's share of a loop's time, from its real rate and its rate with the input taken away."""
    return max(0.0, 1 - real / data_free)


def ceiling_against_plain(ceiling: float, cost: float, real: float, data_free: float) -> list[float]:
    """A ceiling the tool measured (batches/s with the input taken away) and the input's cost it measured, against
    a plain loop's real and data-free rates: the two ceilings, their ratio, the two costs in percent and the
    points between them (the figures of a row of harness.CEILING_COLUMNS)."""
    plain_cost = input_cost(real, data_free)
    return [ceiling, data_free, ceiling / data_free, cost * 100, plain_cost * 100, (cost - plain_cost) * 100]


def calibrated_passes(step_ms: float) -> int:
    """How many passes of a 64x256 by 256x256 product and tanh take `step_ms` milliseconds on this process's torch
    threads (counted over 0.3 s): a CPU step of a known cost, the same on both sides of a comparison."""
    import torch

    weight, x = torch.randn(256, 256), torch.ones(64, 256)
    started, n = time.perf_counter(), 0
    while time.perf_counter() - started < 0.3:
        x = torch.tanh(x @ weight)
        n += 1
    return max(1, round(n * step_ms / 300))
