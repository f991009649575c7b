"""keep_run(): a finished run compared with the earlier runs of its name (run-degradation), then saved;
keep_loader_run(): the same for one loader's report, the finding added to the report."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.history.degradation import run_degradation
from loaderdoctor.history.records import RunRecord, now_iso, run_record
from loaderdoctor.history.store import HistoryWarning, history_path, load_runs, save_run
from loaderdoctor.report import LoaderReport
from loaderdoctor.rules import order
from loaderdoctor.rules.finding import SEVERITIES, Finding

# Earlier runs of the same name read for the comparison (the rule takes the latest comparable ones of them).
EARLIER_RUNS = 50


def keep_run(run: RunRecord, path: Path | None = None) -> Finding | None:
    """Compare `run` with the earlier runs of its name and add a run-degradation finding to it when it is
    clearly slower; then save it. The finding, or None. Never raises: a history that cannot be read or written
    is a HistoryWarning (the run is then saved without the comparison, or not at all, and the warning says so)."""
    earlier: list[RunRecord] = []
    try:
        earlier = load_runs(name=run.name, limit=EARLIER_RUNS, path=path)
    except LoaderDoctorError as error:
        where = history_path() if path is None else path
        reason = error.message + (f"; {error.hint}" if error.hint else "")
        warnings.warn(
            f"loaderdoctor could not compare the {run.kind} run '{run.name}' with earlier runs ({where}): {reason}",
            HistoryWarning,
            stacklevel=2,
        )
    finding = run_degradation(run, earlier)
    if finding is not None:
        run.findings = sorted(
            [finding.to_dict(), *run.findings], key=lambda f: SEVERITIES.index(f.get("severity", "info"))
        )
    save_run(run, path)
    return finding


def keep_loader_run(
    kind: str, report: LoaderReport, started_at: str, host: dict[str, Any], target: str | None = None
) -> None:
    """Keep one loader's run (a watch's, a script's) under its report's name; run-degradation, when found, joins
    the report's findings."""
    degraded = keep_run(run_record(kind, report.name, report, started_at, now_iso(), host, target))
    if degraded is not None:
        report.findings = order([*report.findings, degraded])
