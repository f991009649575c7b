"""Two runs of the history side by side (`loaderdoctor history compare A B`): what changed from A to B, measured
and likeliest cause first (the same ranking run-degradation uses), then their rates, settings, data, host
facts and findings, row by row, each row marked where the two differ."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.history.changes import ranked_changes
from loaderdoctor.history.figures import Change
from loaderdoctor.history.records import RunRecord

SCHEMA = "loaderdoctor.compare/1"
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "unit": self.unit,
            "changes": [{**change.to_dict(), "fix": change.fix} for change in self.changes],
            "rows": [row.to_dict() for row in self.rows],
        }


def compare_runs(a: RunRecord, b: RunRecord) -> RunComparison:
    """B measured against A: the changes from A to B ranked as run-degradation ranks them, and every row."""
    unit, ratio = _ratio(a, b)
    rows = [*_measured_rows(a, b), *_settings_rows(a, b), *_data_rows(a, b), *_host_rows(a, b), *_findings_rows(a, b)]
    return RunComparison(a, b, ratio, unit, ranked_changes(b, [a]), rows)


def _ratio(a: RunRecord, b: RunRecord) -> tuple[str | None, float | None]:
    for unit in ("batches_per_s", "samples_per_s"):
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
