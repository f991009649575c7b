"""A run the history keeps, as an HTML page: its findings first, what was measured, its settings and host, and
the trend of the earlier runs of the same name (rate per run, this one marked), from RunRecord.to_dict()."""

from __future__ import annotations

from typing import Any

from loaderdoctor.render.history import (
    dataset_words,
    finding_from_record,
    local_time,
    measured_rows,
    settings_words,
    short_words,
    span_words,
)
from loaderdoctor.render.html.check import finding_box
from loaderdoctor.render.html.page import data_table, document, esc, facts_table, section, verdict_box
from loaderdoctor.render.html.svg import Highlight, Series, line_chart


def page(run: dict[str, Any], earlier: list[dict[str, Any]]) -> str:
    """`run`, with `earlier`: the runs of its name the history keeps (any order, `run` among them or not)."""
    runs = sorted({r["id"]: r for r in [*earlier, run]}.values(), key=lambda r: (r["started_at"], r["id"]))
    parts = [_findings(run), "<h3>Run</h3>" + facts_table(_facts(run))]
    measured = measured_rows(run.get("measurements") or {})
    parts.append("<h3>Measured</h3>" + (facts_table(measured) if measured else '<p class="muted">nothing measured</p>'))
    trend = ["<h3>Rate of each run</h3>" + _trend(run, runs), _table(run, runs)]
    if run.get("host"):
        trend.append("<h3>Host at this run's start</h3>" + facts_table(_host(run["host"])))
    return document(
        f"loaderdoctor run {run['id']}: {run['name']}",
        f"run {run['id']}: {run['name']}",
        f"{run['kind']}, {span_words(run['started_at'], run['ended_at'])}",
        [section("this run", parts, "loader"), section(f"the runs of '{run['name']}'", trend, "trend")],
    )


def _findings(run: dict[str, Any]) -> str:
    findings = run.get("findings") or []
    if not findings:
        return verdict_box("good", "healthy", "No problems found.")
    boxes = []
    for number, data in enumerate(findings):
        finding = finding_from_record(data)
        boxes.append(
            verdict_box("info", "finding", short_words(data)) if finding is None else finding_box(finding, number == 0)
        )
    return "".join(boxes)


def _facts(run: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("name", run["name"]), ("kind", run["kind"])]
    if run.get("target"):
        rows.append(("target", run["target"]))
    rows.append(("when", span_words(run["started_at"], run["ended_at"])))
    if run.get("dataset"):
        rows.append(("dataset", dataset_words(run["dataset"])))
    rows.append(("settings", settings_words(run.get("settings") or {}, brief=False)))
    return rows


def _gb(value: Any) -> str:
    return "?" if value is None else f"{value / 2**30:.1f} GB"


def _host(host: dict[str, Any]) -> list[tuple[str, str]]:
    """The host's snapshot (snapshot.HostSnapshot as a dict) in a few lines; keys it does not know, as they are."""
    rows = []
    if host.get("usable_cores") is not None:
        rows.append(("cores", f"{host['usable_cores']:g} usable of {host.get('cpu_count')}"))
    if host.get("load_avg_1m") is not None:
        rows.append(("load", f"{host['load_avg_1m']:.2f}, {host.get('load_avg_5m')}, {host.get('load_avg_15m')}"))
    if host.get("memory_total_bytes"):
        rows.append(("memory", f"{_gb(host.get('memory_available_bytes'))} free of {_gb(host['memory_total_bytes'])}"))
    if host.get("shm_total_bytes"):
        rows.append(("/dev/shm", f"{_gb(host.get('shm_used_bytes'))} used of {_gb(host['shm_total_bytes'])}"))
    if host.get("fd_soft_limit") is not None:
        rows.append(("open files", f"{host.get('open_fds')} of {host['fd_soft_limit']}"))
    versions = [
        f"{name} {host[key]}"
        for name, key in (("Python", "python_version"), ("torch", "torch_version"))
        if host.get(key)
    ]
    if versions:
        rows.append(("versions", ", ".join(versions)))
    said = {
        "usable_cores",
        "cpu_count",
        "load_avg_1m",
        "load_avg_5m",
        "load_avg_15m",
        "memory_available_bytes",
        "memory_total_bytes",
        "shm_used_bytes",
        "shm_total_bytes",
        "open_fds",
        "fd_soft_limit",
        "python_version",
        "torch_version",
        "affinity_cores",
        "swap_total_bytes",
    }
    rows.extend((key, short_words(value)) for key, value in host.items() if key not in said and value is not None)
    return rows


def _rate(run: dict[str, Any]) -> tuple[float | None, str]:
    """The run's rate and its unit: batches/s, or samples/s for a scale run (its aggregate over ranks)."""
    m = run.get("measurements") or {}
    if run["kind"] == "scale":
        return m.get("samples_per_s"), "samples/s"
    return m.get("batches_per_s"), "batches/s"


def _trend(run: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    unit = _rate(run)[1]
    points, rings = [], []
    for number, other in enumerate(runs):
        rate, other_unit = _rate(other)
        if rate is None or other_unit != unit:
            continue
        title = f"run {other['id']} ({other['kind']}, {local_time(other['started_at'])}): {rate:.1f} {unit}"
        points.append((float(number), float(rate), title))
        if other["id"] == run["id"]:
            rings.append(Highlight(float(number), float(rate), f"run {run['id']}"))
    if not points:
        return f'<p class="muted">No run of this name measured a rate in {esc(unit)}.</p>'
    ticks = [(float(n), f"#{r['id']}") for n, r in enumerate(runs)]
    return line_chart(
        [Series(f"{unit} per run", tuple(points), "s0")],
        label=f"rate of each run of '{run['name']}', oldest first",
        x_label="runs, oldest first (history ids)",
        y_label=unit,
        highlights=rings,
        x_ticks=ticks,
    )


def _table(run: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    rows, marked = [], []
    for number, other in enumerate(reversed(runs)):
        rate, unit = _rate(other)
        findings = other.get("findings") or []
        main = f"{findings[0].get('rule', '?')}: {findings[0].get('title', '')}" if findings else "none"
        rows.append(
            [
                local_time(other["started_at"]),
                str(other["id"]),
                other["kind"],
                settings_words(other.get("settings") or {}, brief=True),
                "-" if rate is None else f"{rate:.1f} {unit}",
                main,
            ]
        )
        if other["id"] == run["id"]:
            marked.append(number)
    return data_table(["when", "id", "kind", "settings", "rate", "main finding"], rows, numeric=(1,), marked=marked)
