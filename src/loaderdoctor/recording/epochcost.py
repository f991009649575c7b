"""What an epoch takes, now and with the verified fix, in time and (given a price per hour) in money."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loaderdoctor.plain.data import dataclass_from_written
from loaderdoctor.plain.words import duration, money
from loaderdoctor.recording.rates import epoch_batches, training_rate


@dataclass
class EpochCost:
    """An epoch of `batches` at the measured rate, and at the verified fix's rate when it helped; where the machine's
    load moved the fix's measurement too much for one figure (Verification.unsteady), its range of speedups, and
    a range of epoch times with the fix instead of one."""

    batches: int
    batches_per_s: float
    fixed_batches_per_s: float | None  # the verified fix's rate; None without a fix that helped
    cost_per_hour: float | None
    fixed_speedup_range: tuple[float, float] | None = None  # the pairs' lowest and highest speedup, when unsteady

    def __post_init__(self) -> None:
        if self.batches_per_s <= 0:
            raise ValueError(f"an epoch's rate is above 0 batches/s, not {self.batches_per_s}")

    @property
    def epoch_s(self) -> float:
        return self.batches / self.batches_per_s

    @property
    def fixed_epoch_s(self) -> float | None:
        """An epoch with the fix, where one figure was measured fairly."""
        if not self.fixed_batches_per_s or self.fixed_speedup_range is not None:
            return None
        return self.batches / self.fixed_batches_per_s

    @property
    def fixed_epoch_range_s(self) -> tuple[float, float] | None:
        """The shortest and longest epoch with the fix, from the range of speedups, where there is no one figure."""
        if not self.fixed_batches_per_s or self.fixed_speedup_range is None:
            return None
        low, high = self.fixed_speedup_range
        return self.epoch_s / high, self.epoch_s / low

    def _cost(self, seconds: float | None) -> float | None:
        return None if self.cost_per_hour is None or seconds is None else self.cost_per_hour * seconds / 3600

    @property
    def saved_per_epoch(self) -> float | None:
        now, fixed = self._cost(self.epoch_s), self._cost(self.fixed_epoch_s)
        return None if now is None or fixed is None else now - fixed

    def words(self) -> str:
        """'18,968 batches: 2 h 31 min now, 1 h 18 min with the fix; $40 saved per epoch'."""
        text = f"an epoch of {self.batches:,} batches: {duration(self.epoch_s)} now"
        fixed_s, fixed_range = self.fixed_epoch_s, self.fixed_epoch_range_s
        if fixed_s is not None:
            text += f", {duration(fixed_s)} with the fix"
        elif fixed_range is not None:
            text += (
                f", {duration(fixed_range[0])} to {duration(fixed_range[1])} with the fix (the machine's load moved "
                "its measurement too much for one figure)"
            )
        cost = self._cost(self.epoch_s)
        if cost is not None:
            saved = self.saved_per_epoch
            text += f"; {money(cost)} per epoch" + ("" if saved is None else f", {money(saved)} saved with the fix")
        return text

    def to_dict(self) -> dict[str, Any]:
        fixed_s, fixed_range = self.fixed_epoch_s, self.fixed_epoch_range_s
        saved = self.saved_per_epoch
        return {
            "batches": self.batches,
            "batches_per_s": self.batches_per_s,  # unrounded, as the figures below derive from them
            "fixed_batches_per_s": self.fixed_batches_per_s,
            "epoch_s": round(self.epoch_s, 6),
            "fixed_epoch_s": None if fixed_s is None else round(fixed_s, 6),
            "fixed_speedup_range": None if self.fixed_speedup_range is None else list(self.fixed_speedup_range),
            "fixed_epoch_s_range": None if fixed_range is None else [round(s, 6) for s in fixed_range],
            "cost_per_hour": self.cost_per_hour,
            "cost_per_epoch": None if (c := self._cost(self.epoch_s)) is None else round(c, 6),
            "fixed_cost_per_epoch": None if (c := self._cost(fixed_s)) is None else round(c, 6),
            "saved_per_epoch": None if saved is None else round(saved, 6),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpochCost:
        """The EpochCost whose to_dict() is `data` (its times and costs recomputed)."""
        return dataclass_from_written(cls, data)


def epoch_cost(report: Any, batches: int | None, cost_per_hour: float | None) -> EpochCost | None:
    """The epoch cost of a loader's report (check's LoaderReport): `batches` per epoch (default: the loader's
    length), at the rate measured (the verification's before, when it measured one) and at the fix's; None
    where no rate or no epoch length is known."""
    rec = report.recording
    batches = batches or epoch_batches(rec)
    verification = report.verification
    before = verification.before if verification is not None and verification.speedup is not None else None
    rate = before or training_rate(rec)
    if not batches or not rate:
        return None
    fixed = verification.after if verification is not None and verification.helped and verification.after else None
    unsteady = fixed is not None and verification.unsteady and verification.spread is not None
    return EpochCost(batches, rate, fixed, cost_per_hour, verification.spread if unsteady else None)
