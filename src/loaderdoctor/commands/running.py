"""How check, tune and scale run from the command line: live progress on stderr, the run kept in the history, the
report shown (and logged to the trackers of --log-to), and on Ctrl-C or SIGTERM what was measured so far, shown
and kept (every child ended, every temporary folder removed), with the shell's status for a command ended that
way."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from rich.console import Console

from loaderdoctor.errors import LoaderDoctorError, StoppedByUser, Terminated
from loaderdoctor.history.records import now_iso
from loaderdoctor.history.reports import keep_report
from loaderdoctor.host.snapshot import take_snapshot
from loaderdoctor.host.tempfolders import remove_made
from loaderdoctor.integrations.trackers import log_to
from loaderdoctor.kinds import AnyReport
from loaderdoctor.render.progress import LiveProgress
from loaderdoctor.tap.signals import SignalRaises

INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C
TERMINATED = 128 + signal.SIGTERM  # and by SIGTERM: 143


def measure_and_show(
    measure: Callable[[LiveProgress], Any],
    show: Callable[[Any], None],
    err: Console,
    *,
    report_type: type,
    stopped: str,
    budget_s: float | None = None,
) -> int:
    """Run `measure` (given the live progress) and `show` its report: its exit status. Ctrl-C or SIGTERM stops
    it: `stopped` on stderr ("{by}" in it says which), then the partial report of `report_type` the measurement
    left, and INTERRUPTED or TERMINATED. SIGTERM is raised as Terminated, a KeyboardInterrupt, so that it takes
    the very paths Ctrl-C takes (SignalRaises: even where Python would swallow it), unless the program had a
    handler of its own for it."""
    term = SignalRaises(signal.SIGTERM, Terminated)
    term.install()
    try:
        try:
            with LiveProgress(err, budget_s) as live:  # the time left of `budget_s`, the measuring's in all
                report = measure(live)
        except StoppedByUser as stop:
            if not isinstance(stop.partial, report_type) or not stop.partial.loaders:
                raise
            err.print(_stopped_line(term, stopped))
            show(stop.partial)
            return _stopped_status(term)
        show(report)
        if term.received is not None:  # its exception was swallowed, and the command ended before it came again
            err.print(f"stopped by {_signal_name(term.received)}")
            return _stopped_status(term)
        return report.exit_status
    except KeyboardInterrupt:
        if term.received is None:
            raise  # Ctrl-C with nothing measured: the command line says "interrupted"
        err.print(f"stopped by {_signal_name(term.received)}")
        return _stopped_status(term)
    finally:
        term.uninstall()
        remove_made()


def _stopped_line(term: SignalRaises, stopped: str) -> str:
    if term.received is None:
        return "interrupted: " + stopped.format(by="Ctrl-C")
    name = _signal_name(term.received)
    return f"stopped by {name}: " + stopped.format(by=name)


def _stopped_status(term: SignalRaises) -> int:
    return INTERRUPTED if term.received is None else 128 + term.received


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def kept(kind: str, keep: bool, measure: Callable[[], Any]) -> Any:
    """measure()'s report, its runs kept in the history when `keep` (with the host as it was at the start); on
    Ctrl-C or SIGTERM, what was measured until then is kept (as `run` keeps a stopped script's) and the stop
    goes on."""
    started_at, snapshot = now_iso(), take_snapshot()
    try:
        report = measure()
    except StoppedByUser as stop:
        if keep and isinstance(stop.partial, AnyReport) and stop.partial.loaders:
            keep_report(kind, stop.partial, started_at, snapshot)
        raise
    if keep:
        keep_report(kind, report, started_at, snapshot)
    return report


def log_to_trackers(report: Any, trackers: list[str], err: Console) -> None:
    """Log the report to each tracker of --log-to, saying on stderr where it went; a tracker's own failure (its
    server, its files) is a LoaderDoctorError that names it, once the report has been shown and kept."""
    for tracker in trackers:
        try:
            where = log_to(report, tracker)
        except LoaderDoctorError:
            raise
        except Exception as error:
            raise LoaderDoctorError(
                f"could not log the report to {tracker}: {type(error).__name__}: {error}",
                hint="the report itself was shown as usual",
            ) from error
        err.print(f"logged to {tracker}: {where}", highlight=False, markup=False, soft_wrap=True)
