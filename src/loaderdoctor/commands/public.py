"""The check(), tune() and scale() of `import loaderdoctor`: the measuring calls, showing their progress (the phase,
the time left of the budget) where someone watches: a Jupyter cell, or a terminal's stderr."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from loaderdoctor.check import check as _check
from loaderdoctor.errors import UsageError
from loaderdoctor.render.progress import watching_display
from loaderdoctor.report import Report
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.scale.run import rank_counts
from loaderdoctor.scale.run import scale as _scale
from loaderdoctor.tune import TuneReport
from loaderdoctor.tune import tune as _tune


def _default(call: Callable[..., Any], name: str) -> Any:
    return inspect.signature(call).parameters[name].default


# Each call's defaults, as its own signature gives them (the time left is counted from the budget it will use).
_CHECK_BUDGET_S = _default(_check, "budget_s")
_TUNE_BUDGET_S = _default(_tune, "budget_s")
_SCALE_BUDGET_S = _default(_scale, "budget_s")
_SCALE_RANKS = _default(_scale, "ranks")


@functools.wraps(_check)
def check(target_or_loader: Any, **options: Any) -> Report:
    if options.get("progress") is not None:  # the caller's own display
        return _check(target_or_loader, **options)
    with watching_display("check", options.get("budget_s", _CHECK_BUDGET_S)) as display:
        return _check(target_or_loader, **{**options, "progress": display.check_update})


@functools.wraps(_tune)
def tune(target_or_loader: Any, **options: Any) -> TuneReport:
    if options.get("progress") is not None:
        return _tune(target_or_loader, **options)
    with watching_display("tune", options.get("budget_s", _TUNE_BUDGET_S)) as display:
        return _tune(target_or_loader, **{**options, "progress": display.tune_update})


@functools.wraps(_scale)
def scale(target: str, **options: Any) -> ScaleReport:
    if options.get("progress") is not None:
        return _scale(target, **options)
    with watching_display("scale", _scale_budget_s(options)) as display:
        return _scale(target, **{**options, "progress": display.scale_update})


def _scale_budget_s(options: dict[str, Any]) -> float | None:
    """scale's measuring time in all: its budget per launch times the launches (a lock's proof, when one is
    needed, and each launch's start come on top); None when the options are wrong (scale itself says how)."""
    try:
        launches = len(rank_counts(options.get("ranks", _SCALE_RANKS)))
    except (UsageError, TypeError):
        return None
    budget_s = options.get("budget_s", _SCALE_BUDGET_S)
    return budget_s * launches if isinstance(budget_s, (int, float)) else None


_STOPPED = "Ctrl-C raises StoppedByUser, whose `report` holds what was measured so far."
for _call, _stopped in (
    (check, _STOPPED),
    (tune, _STOPPED),
    (scale, "Ctrl-C ends every rank and raises KeyboardInterrupt."),
):
    _call.__doc__ = (_call.__doc__ or "") + (
        f"\n\n    While {_call.__name__} runs, a line shows its phase and the time left of the budget: in a Jupyter"
        "\n    cell, or on stderr when it is a terminal; a `progress` callback given replaces it."
        f"\n    {_stopped}"
    )
