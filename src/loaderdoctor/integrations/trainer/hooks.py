"""What the trainer callbacks (Lightning's, Hugging Face's) share: a hook that never lets loaderdoctor's failure
reach the training run, and the report printed at the end."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.render.console import render
from loaderdoctor.render.terminal import SafeConsole
from loaderdoctor.report import Report

log = logging.getLogger("loaderdoctor")

Hook = TypeVar("Hook", bound=Callable[..., None])


def measuring(state: str, what: str) -> Callable[[Hook], Hook]:
    """A decorator for a callback's hooks: the hook runs while the callback's `state` attribute (what it keeps of
    the run under way: broken, finished) says the run is measured; a failure of loaderdoctor's ends the measuring,
    said once as a warning ("loaderdoctor stopped measuring `what`"), and the training goes on."""

    def decorate(hook: Hook) -> Hook:
        @functools.wraps(hook)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> None:
            run = getattr(self, state)
            if run is None or run.broken or run.finished:
                return
            try:
                hook(self, *args, **kwargs)
            except Exception as error:
                run.broken = True
                warnings.warn(
                    f"loaderdoctor stopped measuring {what}: {type(error).__name__}: {error}",
                    LoaderDoctorWarning,
                    stacklevel=2,
                )

        return guarded  # type: ignore[return-value]

    return decorate


def print_report(report: Report) -> None:
    """The diagnosis on stderr, control characters made visible; a failure to print is a log line, no more."""
    try:
        render(report, SafeConsole(stderr=True))
    except Exception as error:
        log.warning("loaderdoctor could not print its diagnosis: %s: %s", type(error).__name__, error)


def check_callback_options(callback: str, name: Any, cost_per_hour: Any) -> None:
    """A callback's `name` and `cost_per_hour`, as both callbacks take them; UsageError for a bad one."""
    if name is not None and (not isinstance(name, str) or not name):
        raise UsageError(f"{callback}'s name must be a non-empty string, not {name!r}")
    if cost_per_hour is not None and (
        isinstance(cost_per_hour, bool) or not isinstance(cost_per_hour, (int, float)) or cost_per_hour < 0
    ):
        raise UsageError(f"cost_per_hour must be a number, 0 or more, not {cost_per_hour!r}")
