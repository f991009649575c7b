"""How long a measurement may run: the user's budget checked once, and the allowance a stretch of it gets."""

from __future__ import annotations

import math

from loaderdoctor.errors import UsageError


def check_budget(budget_s: float, step_ms: float | None = None) -> None:
    """A UsageError unless `budget_s` is a finite number of seconds above 0, and a training step of `step_ms`
    (when given) fits in it: a step longer than the whole budget could not measure one batch."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise UsageError(f"the budget must be more than 0 seconds, not {budget_s}")
    if step_ms is not None and step_ms / 1000.0 > budget_s:
        raise UsageError(
            f"a training step of {step_ms:g} ms is longer than the budget of {budget_s:g} s: not one batch could "
            "be measured",
            hint="--step-ms is in milliseconds: give the time one training step takes, or a larger --budget",
        )


def target_limit_s(budget_s: float) -> float:
    """How long importing a target and calling its function may take before it is declared stuck: as long as a
    stretch of the whole budget may run."""
    return deadline_allowance(budget_s)


def deadline_allowance(seconds: float) -> float:
    """How long a stretch meant to take `seconds` may run before a wait is declared over the budget."""
    return seconds * 1.5 + 5.0
