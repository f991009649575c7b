"""The console rendering of a ScaleReport: per loader a table of the runs (one per rank count), the findings
across ranks, the lock-free proof, and the DDP plan."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.text import Text

from loaderdoctor.recording.limit import reaches_limit
from loaderdoctor.render.columns import Justify, column_widths, line, line_width
from loaderdoctor.render.console import finding_view, host_findings, host_view, loader_findings, shown_findings
from loaderdoctor.render.plan import plan_view
from loaderdoctor.report import Verification
from loaderdoctor.scale.report import RankFigures, ScaleLoaderReport, ScaleReport, ScaleRun

# An efficiency under this is a scaling problem worth colour.
_POOR_EFFICIENCY = 0.7


def render(report: ScaleReport, console: Console) -> None:
    nodes = f" on {report.nnodes} nodes" if report.nnodes > 1 else ""
    console.print(Text.assemble(("loaderdoctor scale ", "bold"), (report.target, "bold cyan"), nodes))
    for loader in report.loaders.values():
        console.print()
        console.print(_loader(loader, console.width), crop=False)  # code blocks keep their whole lines
    machine = host_findings(lr.findings for lr in report.loaders.values())
    if machine:
        console.print()
        console.print(host_view(machine), crop=False)
    console.print()
    console.print(_summary(report))


def _loader(lr: ScaleLoaderReport, width: int) -> Group:
    parts: list[Any] = [Text(f"loader '{lr.name}'", style="bold underline"), _runs(lr.runs, width)]
    for run in lr.runs:
        for failure in run.failures:
            parts.append(Text(f"  ✖ {run.ranks} ranks: {failure}", style="bold red"))
    findings = loader_findings(lr.findings, job_apart=False)
    if not findings:
        parts.append(Text("  No problems found across the ranks.", style="green"))
    for finding in findings:
        parts.append(finding_view(finding))
    if lr.verification is not None:
        parts.append(_proof(lr.verification))
    if lr.plan is not None:
        parts.append(Text(""))
        parts.append(plan_view(lr.plan))
    return Group(*parts)


def _runs(runs: list[ScaleRun], width: int) -> Group:
    """A line per run with its ranks side by side where they fit (120 columns, as a rule); else a line per rank
    under its run's figures (80 columns). Each figure whole, never wrapped."""
    rows = []
    for run in runs:
        total = "-" if run.samples_per_s is None else f"{run.samples_per_s:.1f}"
        efficiency: str | Text = "-"
        if run.efficiency is not None:
            style = "bold red" if run.efficiency < _POOR_EFFICIENCY else "green"
            efficiency = Text(f"{run.efficiency:.2f}", style=style)
        rows.append([str(run.ranks), total, efficiency, [_rank_cell(f) for f in run.per_rank]])
    side_by_side = [[*row[:3], Text("  ").join(row[3])] for row in rows]
    widths = column_widths([list(_HEADERS), *side_by_side])
    lines: list[Any] = [line(_HEADERS, widths, _JUSTIFY, style="bold")]
    if line_width(widths) <= width:
        lines.extend(line(row, widths, _JUSTIFY) for row in side_by_side)
    else:
        one_each = [[*row[:3], rank] for row in rows for rank in row[3][:1]]
        widths = column_widths([list(_HEADERS), *one_each])
        lines = [line(_HEADERS, widths, _JUSTIFY, style="bold")]
        for row in rows:
            lines.append(line([*row[:3], row[3][0] if row[3] else ""], widths, _JUSTIFY))
            lines.extend(line(["", "", "", rank], widths, _JUSTIFY) for rank in row[3][1:])
    notes = [_PER_RANK]
    base = runs[0].base_ranks if runs else 1
    if base != 1:
        notes.append(f"efficiency against {base} ranks: the smallest run measured")
    lines.extend(Padding(Text(note, style="dim"), (0, 0, 0, 2)) for note in notes)
    return Group(*lines)


_HEADERS = ("ranks", "samples/s", "efficiency", "per rank")
_JUSTIFY: tuple[Justify, ...] = ("right", "right", "right", "left")
_PER_RANK = (
    "per rank: samples/s (the share of the time it waited on data; its share of the rank's limit, its cores shared)"
)


def _rank_cell(figures: RankFigures) -> Text:
    return Text(rank_words(figures), style="red" if figures.samples_per_s is None else "")


def rank_words(figures: RankFigures) -> str:
    """'r1 45.2 (30%; 85% of limit)': a rank's rate, its wait on data, its share of its limit where known; or
    'r1 failed' (its outcome) when it measured no rate."""
    if figures.samples_per_s is None:
        return f"r{figures.rank} {figures.outcome}"
    notes = []
    if figures.wait_fraction is not None:
        notes.append(f"{figures.wait_fraction * 100:.0f}%")
    if figures.share_of_limit is not None:
        notes.append("at limit" if reaches_limit(figures.share_of_limit) else f"{figures.share_of_limit:.0%} of limit")
    return f"r{figures.rank} {figures.samples_per_s:.1f}" + (f" ({'; '.join(notes)})" if notes else "")


def _proof(v: Verification) -> Group:
    if v.verdict == "faster":
        head = Text.assemble(("\n✔ proved  ", "bold green"), "the lock is the cost")
        style = "green"
    else:
        head = Text.assemble(("\n? not proved  ", "bold yellow"), "the lock-free run")
        style = "yellow"
    return Group(head, Padding(Text(v.note, style=style), (0, 0, 0, 4)))


def _summary(report: ScaleReport) -> Text:
    shown = shown_findings(lr.findings for lr in report.loaders.values())
    critical = sum(f.severity == "critical" for f in shown)
    warnings = sum(f.severity == "warning" for f in shown)
    failed = sum(run.failed for lr in report.loaders.values() for run in lr.runs)
    words = [f"{n} {what}" for n, what in ((critical, "critical"), (warnings, "warning"), (failed, "failed run")) if n]
    style = "bold red" if critical or failed else "yellow" if warnings else "green"
    return Text(f"Summary: {', '.join(words) or 'no findings'}.", style=style)
