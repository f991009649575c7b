"""The console rendering of a ScaleReport: per loader a table of the runs (one per rank count), the findings
across ranks, the lock-free proof, and the DDP plan."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from loaderdoctor.recording.limit import reaches_limit
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
        console.print(_loader(loader), crop=False)  # code blocks keep their whole lines
    machine = host_findings(lr.findings for lr in report.loaders.values())
    if machine:
        console.print()
        console.print(host_view(machine), crop=False)
    console.print()
    console.print(_summary(report))


def _loader(lr: ScaleLoaderReport) -> Group:
    parts: list[Any] = [Text(f"loader '{lr.name}'", style="bold underline"), _runs(lr.runs)]
    for run in lr.runs:
        for failure in run.failures:
            parts.append(Text(f"  ✖ {run.ranks} ranks: {failure}", style="bold red"))
    findings = loader_findings(lr.findings)
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


def _runs(runs: list[ScaleRun]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 2))
    table.add_column("ranks", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("efficiency", justify="right")
    table.add_column("per rank: samples/s (waiting on data; share of the rank's limit, its cores shared)")
    base = runs[0].base_ranks if runs else 1
    for run in runs:
        total = "-" if run.samples_per_s is None else f"{run.samples_per_s:.1f}"
        if run.efficiency is None:
            efficiency = "-"
        else:
            style = "bold red" if run.efficiency < _POOR_EFFICIENCY else "green"
            efficiency = f"[{style}]{run.efficiency:.2f}[/]"
        ranks = "  ".join(_rank_cell(f) for f in run.per_rank)
        table.add_row(str(run.ranks), total, efficiency, ranks)
    if base != 1:
        table.caption = f"efficiency against {base} ranks: the smallest run measured"
    return table


def _rank_cell(figures: RankFigures) -> str:
    words = rank_words(figures)
    return f"[red]{words}[/]" if figures.samples_per_s is None else words


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
