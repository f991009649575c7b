"""The one run() of the measuring commands (check, tune, scale): the measurement with live progress, its runs kept
in the history unless --no-history, its report shown as the options say, and a stop's partial report shown and
kept (commands/running.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rich.console import Console

from loaderdoctor.commands.running import kept, measure_and_show
from loaderdoctor.commands.showing import show
from loaderdoctor.kinds import BY_NAME
from loaderdoctor.render.progress import LiveProgress


def run_measuring(
    kind: str,
    args: argparse.Namespace,
    out: Console,
    err: Console,
    measure: Callable[[LiveProgress], Any],
    *,
    stopped: str,
    budget_s: float,
) -> int:
    """Run the command of `kind` ("check", "tune", "scale"; kinds.py): measure(live) and show its report; on Ctrl-C
    or SIGTERM, `stopped` and what was measured so far, status 130 or 143. `budget_s` is the measuring's in all,
    for the progress line's time left."""
    return measure_and_show(
        lambda live: kept(kind, not args.no_history, lambda: measure(live)),
        lambda report: show(report, args, out, err),
        err,
        report_type=BY_NAME[kind].report,
        stopped=stopped,
        budget_s=budget_s,
    )
