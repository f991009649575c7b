"""The runs of check, tune and scale as the history keeps them: one RunRecord per loader of a report, compared
with the earlier runs of its name (run-degradation) and saved, the finding added to the report shown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loaderdoctor.history.keep import keep_run
from loaderdoctor.history.records import RunRecord, now_iso, run_record
from loaderdoctor.host.snapshot import HostSnapshot
from loaderdoctor.kinds import AnyReport, kind_of
from loaderdoctor.report import Report
from loaderdoctor.rules import order
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.tune.result import TuneReport


def run_name(target: str, loader: str) -> str:
    """What a loader's runs are compared by: 'demo/train', 'train.py:make/val'."""
    return f"{target}/{loader}"


def _check_runs(report: Report, started_at: str, host: dict[str, Any]) -> dict[str, RunRecord]:
    ended_at = now_iso()
    return {
        name: run_record("check", run_name(report.target, name), lr, started_at, ended_at, host, report.target)
        for name, lr in report.loaders.items()
    }


def _tune_runs(report: TuneReport, started_at: str, host: dict[str, Any]) -> dict[str, RunRecord]:
    """A tune's run is its baseline (the user's settings, measured), with what it chose beside it."""
    runs = {}
    for name, tuning in report.loaders.items():
        chosen, baseline = tuning.chosen, tuning.baseline
        runs[name] = RunRecord(
            name=run_name(report.target, name),
            kind="tune",
            started_at=started_at,
            ended_at=now_iso(),
            host={**host, "other_processes": []},
            settings=baseline.settings.to_dict(),
            measurements={
                "batches_per_s": round(baseline.batches_per_s, 3) if baseline.runs else None,
                "step_ms": tuning.step_ms,
                "chosen_settings": chosen.settings.to_dict(),
                "chosen_batches_per_s": round(chosen.batches_per_s, 3),
                "speedup": None if tuning.speedup is None else round(tuning.speedup, 3),
                "trials": len(tuning.trials),
                "search_s": round(tuning.seconds, 3),
                "outcome": "completed" if tuning.found else "failed",
            },
            findings=[],
            target=report.target,
        )
    return runs


def _scale_runs(report: ScaleReport, started_at: str, host: dict[str, Any]) -> dict[str, RunRecord]:
    """A scale's run is its largest rank count: aggregate samples/s and efficiency, with every count beside it."""
    runs = {}
    for name, loader in report.loaders.items():
        largest = max(loader.runs, key=lambda run: run.ranks, default=None)
        runs[name] = RunRecord(
            name=run_name(report.target, name),
            kind="scale",
            started_at=started_at,
            ended_at=now_iso(),
            host={**host, "other_processes": []},
            settings={},
            measurements={
                "samples_per_s": None if largest is None else largest.samples_per_s,
                "ranks": None if largest is None else largest.ranks,
                "efficiency": None if largest is None else largest.efficiency,
                "runs": [run.to_dict() for run in loader.runs],
                "outcome": "failed" if largest is None or largest.failed else "completed",
            },
            findings=[f.to_dict() for f in loader.findings],
            target=report.target,
        )
    return runs


# The runs each kind of report (kinds.py) keeps, by the kind's name.
_RUNS: dict[str, Callable[[Any, str, dict[str, Any]], dict[str, RunRecord]]] = {
    "check": _check_runs,
    "tune": _tune_runs,
    "scale": _scale_runs,
}


def keep_report(kind: str, report: AnyReport, started_at: str, snapshot: HostSnapshot) -> None:
    """Keep each loader's run of a check, tune or scale report in the history; a run clearly slower than the
    earlier ones of its name gets its run-degradation finding in the report too (check and scale show it)."""
    runs = _RUNS[kind_of(report).name](report, started_at, snapshot.to_dict())
    for name, run in runs.items():
        degraded = keep_run(run)
        findings = getattr(report.loaders[name], "findings", None)
        if degraded is not None and findings is not None:
            report.loaders[name].findings = order([*findings, degraded])
