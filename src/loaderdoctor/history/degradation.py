"""run-degradation: a run slower than the earlier runs of its name, with what changed since them (measured in
history/changes.py), likeliest cause first."""

from __future__ import annotations

import statistics

from loaderdoctor.history.changes import ranked_changes
from loaderdoctor.history.figures import TAKES_CORES, Change, figure, number, takes_cores, usable_cores
from loaderdoctor.history.processes import cores_taken_by_others
from loaderdoctor.history.records import RunRecord
from loaderdoctor.plain.words import percent
from loaderdoctor.rules.finding import Finding

# A run is degraded below this share of its baseline's rate (the median of the runs compared), critical below
# CRITICAL_SHARE; above it, the difference is within what identical runs on a shared machine swing by.
DEGRADED_SHARE = 0.8
CRITICAL_SHARE = 0.5
BASELINE_RUNS = 5

# The rate compared: batches per second, else samples per second; see _rate_unit for a changed batch size.
RATE_UNITS = {"batches_per_s": "batches/s", "samples_per_s": "samples/s"}


def run_degradation(run: RunRecord, earlier: list[RunRecord]) -> Finding | None:
    """A finding when `run` is slower than DEGRADED_SHARE of the median rate of the earlier runs of its name and
    kind (up to BASELINE_RUNS of the newest that completed, those with its settings preferred), with what changed
    since them, likeliest cause first; None when it is not slower or nothing can be compared. `earlier` is newest
    first."""
    unit = _first_unit(run)
    if unit is None:
        return None
    compared, same_settings = _compared_runs(run, earlier, unit)
    if not compared:
        return None
    unit = _rate_unit(run, compared, unit)
    rate = _rate(run, unit)
    rates = [_rate(r, unit) for r in compared]
    if rate is None or None in rates:
        return None
    baseline_rate = statistics.median(r for r in rates if r is not None)
    ratio = rate / baseline_rate
    if ratio >= DEGRADED_SHARE:
        return None
    changes = ranked_changes(run, compared)
    first = changes[0] if changes else None
    if len(compared) == 1:
        of_runs = f"the last run of {run.name!r}"
    else:
        of_runs = f"the median of the last {len(compared)} runs of {run.name!r}"
    if not same_settings:
        of_runs += " with other settings"
    cause = first.words if first else _unexplained(run)
    named = [p for change in changes for p in change.processes]
    return Finding(
        rule="run-degradation",
        severity="critical" if ratio < CRITICAL_SHARE else "warning",
        title=(
            f"{figure(rate)} {RATE_UNITS[unit]}, {percent(1 - ratio)} below {of_runs} ({figure(baseline_rate)}): "
            f"{cause}"
        ),
        evidence={
            "rate": round(rate, 3),
            "baseline_rate": round(baseline_rate, 3),
            "ratio": round(ratio, 3),
            "unit": unit,
            "same_settings": same_settings,
            "compared_runs": [
                {"id": r.id, "started_at": r.started_at, "rate": round(value, 3)}
                for r, value in zip(compared, rates, strict=True)
                if value is not None
            ],
            "changes": [change.to_dict() for change in changes],
            "likeliest_cause": first.what if first else None,
            "named_processes": named,
        },
        fix=_fix(run, changes),
        snippet=first.snippet if first else None,
        settings_change=first.settings_change if first else {},
        impact=1 - ratio,
    )


# Which runs, and which rate


def _rate(run: RunRecord, unit: str) -> float | None:
    value = number(run.measurements, unit)
    return value if value is not None and value > 0 else None


def _first_unit(run: RunRecord) -> str | None:
    return next((unit for unit in RATE_UNITS if _rate(run, unit) is not None), None)


def _completed(run: RunRecord) -> bool:
    return run.measurements.get("outcome") in (None, "completed")


def _compared_runs(run: RunRecord, earlier: list[RunRecord], unit: str) -> tuple[list[RunRecord], bool]:
    """The runs to compare `run` with, newest first, and whether they have its settings: earlier runs of its name
    and kind that completed with a rate, those with its settings when there are any."""
    comparable = [
        r
        for r in earlier
        if r is not run
        and (run.id is None or r.id != run.id)
        and r.name == run.name
        and r.kind == run.kind
        and _completed(r)
        and _rate(r, unit) is not None
    ]
    same = [r for r in comparable if r.settings == run.settings]
    return (same or comparable)[:BASELINE_RUNS], bool(same)


def _rate_unit(run: RunRecord, compared: list[RunRecord], unit: str) -> str:
    """Samples per second instead of batches when the batch size changed (bigger batches come fewer a second) and
    every run has it; else `unit`."""
    sizes = {r.dataset.get("batch_size") for r in [run, *compared]} - {None}
    runs_have_samples = all(_rate(r, "samples_per_s") is not None for r in [run, *compared])
    return "samples_per_s" if len(sizes) > 1 and runs_have_samples else unit


def _unexplained(run: RunRecord) -> str:
    """The cause's words when no measured change explains the slowdown; never "host as before" while other
    processes took cores during the run (as they did during the runs compared, or it would be a change)."""
    others = cores_taken_by_others(run)
    if takes_cores(others, usable_cores(run)):
        return (
            f"other processes took {others:.1f} cores during this run, as during the runs compared; no other "
            "measured change explains it"
        )
    return "no measured change explains it (host, settings and data as before)"


def _fix(run: RunRecord, changes: list[Change]) -> str:
    """The likeliest cause's fix, with those of the other named processes taking cores in earnest."""
    if not changes:
        where = (
            "the findings of this report say where the time goes now"
            if run.kind in ("check", "tune")
            else "run loaderdoctor check on this loader to find out where the time goes now"
        )
        return f"Nothing measured on the host, in the settings or in the data changed since the earlier runs: {where}."
    first = changes[0]
    others = [c.fix for c in changes[1:] if first.tier == TAKES_CORES and c.tier == TAKES_CORES]
    return " ".join([first.fix, *others])
