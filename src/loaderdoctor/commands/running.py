"""How check, tune and scale run from the command line: live progress on stderr, the run kept in the history, the
report shown, and on Ctrl-C what was measured so far (every worker ended) with the shell's status for an
interrupted command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from loaderdoctor.errors import StoppedByUser
from loaderdoctor.history.records import now_iso
from loaderdoctor.history.reports import keep_report
from loaderdoctor.render.progress import LiveProgress
from loaderdoctor.snapshot import take_snapshot

INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C


def measure_and_show(
    measure: Callable[[LiveProgress], Any],
    show: Callable[[Any], None],
    err: Console,
    *,
    report_type: type,
    interrupted: str,
) -> int:
    """Run `measure` (given the live progress) and `show` its report: its exit status. On Ctrl-C, `interrupted`
    on stderr, then the partial report of `report_type` the measurement left, and INTERRUPTED."""
    try:
        with LiveProgress(err) as live:
            report = measure(live)
    except StoppedByUser as stop:
        if not isinstance(stop.partial, report_type) or not stop.partial.loaders:
            raise
        err.print(interrupted)
        show(stop.partial)
        return INTERRUPTED
    show(report)
    return report.exit_status


def kept(kind: str, keep: bool, measure: Callable[[], Any]) -> Any:
    """measure()'s report, its runs kept in the history when `keep` (with the host as it was at the start)."""
    started_at, snapshot = now_iso(), take_snapshot()
    report = measure()
    if keep:
        keep_report(kind, report, started_at, snapshot)
    return report
