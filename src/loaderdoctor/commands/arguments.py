"""The arguments the subcommands share, and number arguments whose errors are in the user's words:
"--budget must be a number of seconds, not 'abc'"."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from loaderdoctor.integrations.trackers import TRACKERS, check_tracker

TARGET_HELP = (
    "what to {verb}: 'demo' (default), 'scenario:NAME', 'pkg.module:function' or 'path/to/file.py:function'; "
    "the function takes no arguments and returns a DataLoader, a dict of them, or a loaderdoctor.Workload"
)


def add_target_args(parser: argparse.ArgumentParser, verb: str) -> None:
    """The TARGET positional, as every subcommand that measures a loader takes it."""
    parser.add_argument("target", nargs="?", default="demo", help=TARGET_HELP.format(verb=verb))


def add_budget_arg(parser: argparse.ArgumentParser, default_s: float, what: str) -> None:
    """--budget S: seconds of measuring in all; `what` says what they pay for ("the fix's run included")."""
    parser.add_argument(
        "--budget",
        type=number("seconds", minimum=0, inclusive=False),
        default=default_s,
        metavar="S",
        help=f"seconds of {what} (default {default_s:g})",
    )


def add_step_arg(parser: argparse.ArgumentParser, then: str = "") -> None:
    """--step-ms MS: a simulated training step, in place of the target's; `then` says what follows from it."""
    parser.add_argument(
        "--step-ms",
        type=number("milliseconds", minimum=0),
        default=None,
        metavar="MS",
        help=f"simulate a training step of MS milliseconds after each batch{then} (overrides the target's step)",
    )


def add_history_arg(parser: argparse.ArgumentParser) -> None:
    """Where a run is kept besides the report shown: --no-history, not in the history (see `loaderdoctor
    history`); and --log-to TRACKER, also in an experiment tracker (check, tune, scale and run take both)."""
    parser.add_argument(
        "--no-history",
        action="store_true",
        help="do not keep this run in the history ($LOADERDOCTOR_HOME/history.sqlite3)",
    )
    add_log_to_arg(parser)


def add_log_to_arg(parser: argparse.ArgumentParser) -> None:
    """--log-to TRACKER (repeatable): also log the findings, main figures and HTML page to an experiment tracker.
    A tracker not installed is refused as the arguments are read (exit status 2), before anything runs."""
    parser.add_argument(
        "--log-to",
        action="append",
        default=[],
        type=check_tracker,  # a UsageError of its own, not argparse's: it names the extra to install
        metavar="TRACKER",
        help=f"also log the findings, main figures and HTML page to {', '.join(TRACKERS)} (repeatable; the "
        "trackers extra: pip install 'loaderdoctor[trackers]'); W&B and MLflow are configured by their own "
        "environment variables (WANDB_PROJECT, MLFLOW_TRACKING_URI...), TensorBoard writes to ./runs/loaderdoctor",
    )


def add_json_arg(parser: argparse.ArgumentParser, schema: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print the result as JSON (schema {schema})")


def number(what: str, *, minimum: float, inclusive: bool = True) -> Callable[[str], float]:
    """An argparse type: a finite number of `what` (e.g. "seconds") that is at least (or more than) minimum."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of {what}, not {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number of {what}, not {text!r}")
        if value < minimum or (value == minimum and not inclusive):
            bound = f"{minimum:g} or more" if inclusive else f"more than {minimum:g}"
            raise argparse.ArgumentTypeError(f"must be {bound} {what}, not {text!r}")
        return value

    return parse


def count(what: str, *, minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of `what` (e.g. "epochs"), `minimum` or more."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number of {what}, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more {what}, not {text!r}")
        return value

    return parse
