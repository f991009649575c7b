"""The console rendering of two runs compared (history/compare.py): what changed, likeliest cause first, then the
two runs side by side, the rows that differ in bold."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from loaderdoctor.history.compare import RunComparison
from loaderdoctor.render.history import local_time

_UNITS = {"batches_per_s": "batches/s", "samples_per_s": "samples/s"}


def render(comparison: RunComparison, console: Console) -> None:
    a, b = comparison.a, comparison.b
    console.print(
        Text.assemble(("run ", "bold"), (f"{b.id} ", "bold cyan"), (b.name, "bold"), " against ", ("run ", "bold"),
                      (f"{a.id} ", "bold cyan"), a.name),
        soft_wrap=True,
    )  # fmt: skip
    console.print(Text(_rate_words(comparison), style=_rate_style(comparison.ratio)))
    if a.name != b.name:
        console.print(Text("(runs of two names: two loaders or jobs, not one job run twice)", style="dim"))
    console.print()
    if comparison.changes:
        console.print(Text("What changed, likeliest cause first", style="bold"))
        for number, change in enumerate(comparison.changes, 1):
            console.print(Padding(Text(f"{number}. {change.words}"), (0, 0, 0, 2)))
        console.print(Padding(Text.assemble(("fix: ", "dim"), comparison.changes[0].fix), (0, 0, 0, 2)))
    else:
        console.print(Text("No measured change between them: host, settings and data as before.", style="green"))
    console.print()
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 2, 0, 0))
    table.add_column("", style="dim", no_wrap=True)
    table.add_column(f"run {a.id} ({local_time(a.started_at)})", overflow="fold")
    table.add_column(f"run {b.id} ({local_time(b.started_at)})", overflow="fold")
    section = None
    for row in comparison.rows:
        if row.section != section:
            section = row.section
            table.add_row(Text(section, style="bold"), "", "")
        style = "bold yellow" if row.differs else None
        table.add_row(f"  {row.what}", escape(row.a), escape(row.b), style=style)
    console.print(table)


def _rate_words(comparison: RunComparison) -> str:
    ratio, unit = comparison.ratio, comparison.unit
    if ratio is None or unit is None:
        return "No rate to compare: one of the runs measured none."
    a = comparison.a.measurements[unit]
    b = comparison.b.measurements[unit]
    how = f"{1 / ratio:.1f}x slower" if ratio < 1 else f"{ratio:.1f}x faster" if ratio > 1 else "as fast"
    return f"{b:.1f} {_UNITS[unit]} against {a:.1f}: {how} ({ratio:.0%} of run {comparison.a.id}'s rate)"


def _rate_style(ratio: float | None) -> str:
    if ratio is None:
        return "dim"
    return "bold red" if ratio < 0.8 else "green" if ratio >= 0.95 else "yellow"
