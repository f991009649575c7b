"""A ScaleReport as an HTML page: per loader the findings across ranks first, then the aggregate rate and the
scaling efficiency against ranks, each rank's wait on data, the runs' table, the lock-free proof and the DDP plan."""

from __future__ import annotations

from loaderdoctor.plain.words import plural
from loaderdoctor.render.console import host_findings, loader_findings
from loaderdoctor.render.html.check import finding_box, host_section
from loaderdoctor.render.html.page import data_table, document, section, verdict_box
from loaderdoctor.render.html.plan import plan_block
from loaderdoctor.render.html.svg import Bar, Series, bar_chart, legend, line_chart
from loaderdoctor.render.scale import rank_words
from loaderdoctor.scale.report import ScaleLoaderReport, ScaleReport, ScaleRun


def page(report: ScaleReport) -> str:
    nodes = f" on {report.nnodes} nodes" if report.nnodes > 1 else ""
    machine = host_findings(lr.findings for lr in report.loaders.values())
    return document(
        f"loaderdoctor scale {report.target}",
        f"loaderdoctor scale {report.target}",
        f"{plural(len(report.loaders), 'loader')}{nodes}",
        [_loader(lr) for lr in report.loaders.values()] + ([host_section(machine)] if machine else []),
    )


def _loader(lr: ScaleLoaderReport) -> str:
    parts = []
    for run in lr.runs:
        parts.extend(verdict_box("critical", f"{run.ranks} ranks", failure) for failure in run.failures)
    findings = loader_findings(lr.findings, job_apart=False)
    if not findings:
        parts.append(verdict_box("good", "healthy", "No problems found across the ranks."))
    parts.extend(finding_box(f, main=(n == 0)) for n, f in enumerate(findings))
    if lr.verification is not None:
        v = lr.verification
        proved = v.verdict == "faster"
        parts.append(
            verdict_box(
                "good" if proved else "warning",
                "proved" if proved else "not proved",
                "the lock is the cost" if proved else "the lock-free run",
                [v.note],
            )
        )
    parts.append("<h3>Rate against ranks</h3>" + _rate_chart(lr))
    parts.append("<h3>Efficiency</h3>" + _efficiency_chart(lr))
    parts.append("<h3>Each rank's wait on data</h3>" + _wait_chart(lr))
    parts.append("<h3>Runs</h3>" + _table(lr.runs))
    if lr.plan is not None:
        parts.append(plan_block(lr.plan))
    return section(f"loader '{lr.name}'", parts, "loader")


def _measured(runs: list[ScaleRun]) -> list[ScaleRun]:
    return [run for run in runs if run.samples_per_s is not None]


def _rate_chart(lr: ScaleLoaderReport) -> str:
    runs = _measured(lr.runs)
    if not runs:
        return '<p class="muted">No run delivered a rate.</p>'
    base = min(runs, key=lambda run: run.ranks)
    measured = Series(
        "measured",
        tuple((float(r.ranks), r.samples_per_s, f"{r.ranks} ranks: {r.samples_per_s:.1f} samples/s") for r in runs),
        "s0",
    )
    per_rank = base.samples_per_s / base.ranks  # type: ignore[operator]
    ideal = Series(
        "perfect scaling",
        tuple(
            (float(r.ranks), per_rank * r.ranks, f"{r.ranks} ranks, perfect: {per_rank * r.ranks:.1f}") for r in runs
        ),
        "ideal",
    )
    ticks = [(float(r.ranks), str(r.ranks)) for r in runs]
    return line_chart(
        [measured, ideal],
        label=f"samples/s of '{lr.name}' against ranks",
        x_label="ranks",
        y_label="samples/s",
        x_ticks=ticks,
    )


def _efficiency_chart(lr: ScaleLoaderReport) -> str:
    runs = [run for run in lr.runs if run.efficiency is not None]
    if not runs:
        return '<p class="muted">No efficiency: fewer than two runs measured.</p>'
    series = Series(
        "efficiency",
        tuple((float(r.ranks), r.efficiency, f"{r.ranks} ranks: efficiency {r.efficiency:.2f}") for r in runs),  # type: ignore[misc]
        "s1",
    )
    return line_chart(
        [series],
        label=f"scaling efficiency of '{lr.name}'",
        x_label="ranks",
        y_label="efficiency (1 = perfect)",
        x_ticks=[(float(r.ranks), str(r.ranks)) for r in runs],
    )


def _wait_chart(lr: ScaleLoaderReport) -> str:
    bars, ticks = [], []
    for run in lr.runs:
        for figures in run.per_rank:
            ticks.append((len(bars), f"r{figures.rank} of {run.ranks}"))
            share = (figures.wait_fraction or 0.0) * 100
            bars.append(
                Bar(
                    ((share, "wait"), (100 - share if figures.wait_fraction is not None else 0.0, "step")),
                    f"{run.ranks} ranks, rank {figures.rank}: waiting on data {share:.0f}% of the time"
                    f" ({figures.outcome})",
                )
            )
    if not bars:
        return '<p class="muted">No rank reported.</p>'
    chart = bar_chart(
        bars,
        label=f"each rank's share of time waiting on data, '{lr.name}'",
        x_label="each rank (rN of the run's rank count)",
        y_label="% of the time",
        x_tick_labels=ticks,
        y_high=100.0,
    )
    return legend([("wait", "waiting on data"), ("step", "the rest (training)")]) + chart


def _table(runs: list[ScaleRun]) -> str:
    rows = [
        [
            str(run.ranks),
            "-" if run.samples_per_s is None else f"{run.samples_per_s:.1f}",
            "-" if run.efficiency is None else f"{run.efficiency:.2f}",
            "  ".join(rank_words(f) for f in run.per_rank),
        ]
        for run in runs
    ]
    header = ["ranks", "samples/s", "efficiency", "per rank: samples/s (waiting on data; share of the rank's limit)"]
    return data_table(header, rows, numeric=(0, 1, 2))
