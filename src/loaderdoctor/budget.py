"""How long a measurement may run: the user's budget checked once, and the allowance a stretch of it gets."""

from __future__ import annotations

import math

from loaderdoctor.errors import UsageError


def check_budget(budget_s: float) -> None:
    """A UsageError unless `budget_s` is a finite number of seconds above 0."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise UsageError(f"the budget must be more than 0 seconds, not {budget_s}")


def deadline_allowance(seconds: float) -> float:
    """How long a stretch meant to take `seconds` may run before a wait is declared over the budget."""
    return seconds * 1.5 + 5.0
