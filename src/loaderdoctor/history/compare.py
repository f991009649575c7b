"""Two runs of the history side by side (`loaderdoctor history compare A B`, or the newest run of a name against the
runs before it): what changed, measured and likeliest cause first (the same ranking run-degradation uses), their
rates, settings, data, host facts and findings row by row, and the CI gate's verdict (`--fail-if-slower PCT`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.history.changes import ranked_changes
from loaderdoctor.history.degradation import BASELINE_RUNS
from loaderdoctor.history.figures import Change, number
from loaderdoctor.history.records import RunRecord

SCHEMA = "loaderdoctor.compare/1"
# `history compare --name NAME --json`: one comparison per loader of that name, and the gate's verdict on them all.
NAMED_SCHEMA = "loaderdoctor.comparisons/1"
RATE_UNITS = ("batches_per_s", "samples_per_s")  # the rate compared: batches per second, else samples per second
_SETTINGS_ORDER = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "start_method", "backend")
_MEASURED = (
    ("batches/s", "batches_per_s", "{:.1f}"),
    ("samples/s", "samples_per_s", "{:.0f}"),
    ("waiting", "wait_fraction", "{:.0%}"),
    ("training step", "step_ms", "{:.1f} ms"),
    ("interval", "interval_ms", "{:.1f} ms"),
    ("median wait", "wait_ms_p50", "{:.1f} ms"),
    ("workers' memory", "worker_uss_mb_max", "{:.0f} MB"),
    ("outcome", "outcome", "{}"),
)
_GIB = 2**30
_HOST = (
    ("usable cores", "usable_cores", "{:g}"),
    ("load (1 min)", "load_avg_1m", "{:.2f}"),
    ("memory free", "memory_available_bytes", "gib"),
    ("swap used", "swap_used_bytes", "gib"),
    ("/dev/shm used", "shm_used_bytes", "gib"),
    ("open files", "open_fds", "{}"),
    ("torch", "torch_version", "{}"),
    ("host", "hostname", "{}"),
)


@dataclass
class Row:
    """One line of the side-by-side table: a figure of A and of B, in words, and whether they differ."""

    section: str  # "rate" | "settings" | "data" | "host" | "findings"
    what: str
    a: str
    b: str

    @property
    def differs(self) -> bool:
        return self.a != self.b

    def to_dict(self) -> dict[str, Any]:
        return {"section": self.section, "what": self.what, "a": self.a, "b": self.b, "differs": self.differs}


@dataclass
class RunComparison:
    """Run A (the reference) against run B: B's rate over A's, the measured changes from A to B, likeliest cause
    first, and the rows of the side-by-side table."""

    a: RunRecord
    b: RunRecord
    ratio: float | None  # B's rate over A's (batches/s, or samples/s for scale runs); None where one lacks it
    unit: str | None
    changes: list[Change]
    rows: list[Row] = field(default_factory=list)
    # The earlier runs A stands for, newest first, when A is the median of several (see earlier_runs); else [a].
    baseline: list[RunRecord] = field(default_factory=list)
    gate: Gate | None = None  # the CI gate's verdict, when one was asked for (judge)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "unit": self.unit,
            "changes": [{**change.to_dict(), "fix": change.fix} for change in self.changes],
            "rows": [row.to_dict() for row in self.rows],
            "baseline_runs": [run.id for run in self.baseline or [self.a]],
            "gate": None if self.gate is None else self.gate.to_dict(),
        }


@dataclass
class Gate:
    """The CI gate on B against A: failed when B's rate is below A's by more than `threshold` and by more than the
    runs' own spread, where they have one (the range of the baseline runs' rates, over A's rate). Shares, not
    percents: 0.1 is 10%."""

    threshold: float
    rate_a: float | None
    rate_b: float | None
    unit: str | None
    drop: float | None  # 1 - B's rate over A's: above 0 when B is slower; None when one of them has no rate
    spread: float | None  # None when the runs keep no spread of their rate (a baseline of one run)
    spread_runs: int  # how many runs the spread was measured over (0 without one, or when read within each run)
    spread_source: str | None = None  # "over N runs" or "within each run"; None without a spread

    @property
    def verdict(self) -> str:
        """One of "slower" (the gate fails), "within-spread", "within-threshold", "not-slower" or "no-rate"."""
        if self.drop is None:
            return "no-rate"
        if self.drop <= 0:
            return "not-slower"
        if self.drop <= self.threshold:
            return "within-threshold"
        if self.spread is not None and self.drop <= self.spread:
            return "within-spread"
        return "slower"

    @property
    def failed(self) -> bool:
        return self.verdict == "slower"

    def to_dict(self) -> dict[str, Any]:
        def pct(share: float | None) -> float | None:
            return None if share is None else round(share * 100, 1)

        return {
            "verdict": self.verdict,
            "failed": self.failed,
            "threshold_pct": pct(self.threshold),
            "rate_a": self.rate_a,
            "rate_b": self.rate_b,
            "unit": self.unit,
            "drop_pct": pct(self.drop),
            "spread_pct": pct(self.spread),
            "spread_runs": self.spread_runs,
            "spread_source": self.spread_source,
        }


def compare_runs(a: RunRecord, b: RunRecord, baseline: list[RunRecord] | None = None) -> RunComparison:
    """B measured against A: the changes ranked as run-degradation ranks them (against the medians of `baseline`,
    the earlier runs A stands for, when given), and every row of A beside B."""
    unit, ratio = _ratio(a, b)
    rows = [*_measured_rows(a, b), *_settings_rows(a, b), *_data_rows(a, b), *_host_rows(a, b), *_findings_rows(a, b)]
    compared = baseline or [a]
    return RunComparison(a, b, ratio, unit, ranked_changes(b, compared), rows, compared)


def judge(comparison: RunComparison, threshold: float) -> Gate:
    """The gate's verdict on `comparison` for a drop of more than `threshold` (a share: 0.1 for 10%), set on it too.
    The runs' spread is the range of the baseline's rates over A's rate, measured where the baseline has two runs
    or more; a single run keeps no spread of its rate, and then the threshold alone decides."""
    unit = comparison.unit
    rate_a = None if unit is None else number(comparison.a.measurements, unit)
    rate_b = None if unit is None else number(comparison.b.measurements, unit)
    drop = None if comparison.ratio is None else 1 - comparison.ratio
    rates = [r for run in comparison.baseline if unit and (r := number(run.measurements, unit)) is not None]
    if len(rates) >= 2 and rate_a:
        spread, source = (max(rates) - min(rates)) / rate_a, f"over {len(rates)} runs"
    else:
        spread, source = _own_spread(comparison.a, comparison.b), "within each run"
    comparison.gate = Gate(threshold, rate_a, rate_b, unit, drop, spread, len(rates) if spread is not None else 0)
    comparison.gate.spread_source = source if spread is not None else None
    return comparison.gate


def _own_spread(*runs: RunRecord) -> float | None:
    """The widest of the runs' own spreads: how far each run's rate moved over stretches of its steady batches
    (measurements' batches_per_s_range, over its rate); None when neither run kept one (older runs)."""
    spreads = []
    for run in runs:
        span, rate = run.measurements.get("batches_per_s_range"), number(run.measurements, "batches_per_s")
        if isinstance(span, list) and len(span) == 2 and all(isinstance(v, int | float) for v in span) and rate:
            spreads.append((max(span) - min(span)) / rate)
    return max(spreads) if spreads else None


def earlier_runs(newest: RunRecord, earlier: list[RunRecord], count: int = BASELINE_RUNS) -> list[RunRecord]:
    """The runs to compare `newest` with: the `count` newest of `earlier` (newest first) of its name and kind that
    completed with a rate, as run-degradation takes them (of any settings: a changed setting is what a gate is for)."""
    return [
        run
        for run in earlier
        if run.name == newest.name
        and run.kind == newest.kind
        and run is not newest
        and (newest.id is None or run.id != newest.id)
        and run.measurements.get("outcome") in (None, "completed")
        and _rate(run) is not None
    ][:count]


def median_run(runs: list[RunRecord]) -> RunRecord:
    """The run of median rate (the lower of the two middle ones for an even count): a real run to set beside."""
    by_rate = sorted(runs, key=lambda run: _rate(run) or 0.0)
    return by_rate[(len(by_rate) - 1) // 2]


def _rate(run: RunRecord) -> float | None:
    return next((value for unit in RATE_UNITS if (value := number(run.measurements, unit))), None)


def _ratio(a: RunRecord, b: RunRecord) -> tuple[str | None, float | None]:
    for unit in RATE_UNITS:
        before, now = a.measurements.get(unit), b.measurements.get(unit)
        if isinstance(before, int | float) and isinstance(now, int | float) and before > 0:
            return unit, now / before
    return None, None


def _words(value: Any, form: str) -> str:
    if value is None:
        return "-"
    if form == "gib":
        return f"{value / _GIB:.1f} GB" if isinstance(value, int | float) else str(value)
    try:
        return form.format(value)
    except (TypeError, ValueError):
        return str(value)


def _measured_rows(a: RunRecord, b: RunRecord) -> list[Row]:
    rows = [Row("rate", "kind", a.kind, b.kind), Row("rate", "started", a.started_at[:19], b.started_at[:19])]
    for what, key, form in _MEASURED:
        if key in a.measurements or key in b.measurements:
            rows.append(Row("rate", what, _words(a.measurements.get(key), form), _words(b.measurements.get(key), form)))
    return rows


def _settings_rows(a: RunRecord, b: RunRecord) -> list[Row]:
    keys = [k for k in _SETTINGS_ORDER if k in a.settings or k in b.settings]
    keys += sorted((a.settings.keys() | b.settings.keys()) - set(keys))
    return [Row("settings", key, str(a.settings.get(key, "-")), str(b.settings.get(key, "-"))) for key in keys]


def _data_rows(a: RunRecord, b: RunRecord) -> list[Row]:
    keys = [k for k in ("name", "len", "batch_size", "batches_per_epoch") if k in a.dataset or k in b.dataset]
    return [Row("data", f"dataset {key}", str(a.dataset.get(key, "-")), str(b.dataset.get(key, "-"))) for key in keys]


def _host_rows(a: RunRecord, b: RunRecord) -> list[Row]:
    rows = [
        Row("host", what, _words(a.host.get(key), form), _words(b.host.get(key), form))
        for what, key, form in _HOST
        if key in a.host or key in b.host
    ]
    rows.append(Row("host", "other processes", _processes(a.host), _processes(b.host)))
    rows.append(Row("host", "stray workers", _strays(a.host), _strays(b.host)))
    return rows


def _processes(host: dict[str, Any]) -> str:
    others = host.get("other_processes") or []
    return ", ".join(f"pid {p.get('pid')} ({p.get('cores', 0):.1f} cores)" for p in others[:3]) or "none"


def _strays(host: dict[str, Any]) -> str:
    strays = host.get("stray_workers") or []
    return ", ".join(f"pid {s.get('pid')}" for s in strays[:3]) or "none"


def _findings_rows(a: RunRecord, b: RunRecord) -> list[Row]:
    def main(run: RunRecord) -> str:
        finding = run.main_finding
        return "none" if finding is None else f"{finding.get('rule')}: {finding.get('title')}"

    def rules(run: RunRecord) -> str:
        return ", ".join(str(f.get("rule")) for f in run.findings) or "none"

    return [Row("findings", "main finding", main(a), main(b)), Row("findings", "all", rules(a), rules(b))]
