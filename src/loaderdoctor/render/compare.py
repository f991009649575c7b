"""The console rendering of two runs compared (history/compare.py): what changed, likeliest cause first, the two
runs side by side, the rows that differ in bold, and at the end the CI gate's verdict, a line per loader."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from loaderdoctor.history.compare import Gate, RunComparison
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
    if len(comparison.baseline) > 1:
        ids = ", ".join(str(run.id) for run in comparison.baseline)
        console.print(
            Text(f"(run {a.id} is the median of the {len(comparison.baseline)} runs before run {b.id}: runs {ids})",
                 style="dim"),
            soft_wrap=True,
        )  # fmt: skip
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


def render_gates(comparisons: list[RunComparison], console: Console, alone: list[str] | None = None) -> int:
    """The gate's verdict, the last lines printed: one line for one comparison, else a line per loader (`alone`
    names those with no earlier run to compare with) and one for them all. Returns the exit status: 1 when a
    comparison's gate failed, else 0."""
    gates = [(c.b.name, c.gate) for c in comparisons if c.gate is not None]
    status = 1 if any(gate.failed for _, gate in gates) else 0
    alone = alone or []
    if not gates:
        render_alone(alone, console)
        console.print(Text("gate: no earlier run to compare with yet: exit 0", style=_gate_style(0)), soft_wrap=True)
        return 0
    if len(gates) == 1 and not alone:
        console.print(
            Text(f"gate: {gate_words(gates[0][1])}: exit {status}", style=_gate_style(status)), soft_wrap=True
        )
        return status
    for name, gate in gates:
        console.print(Text(f"gate {name}: {gate_words(gate)}", style=_gate_style(int(gate.failed))), soft_wrap=True)
    render_alone(alone, console, "gate ")
    slower = [name for name, gate in gates if gate.failed]
    loaders = f"{len(gates) + len(alone)} loaders"
    verdict = f"{len(slower)} of {loaders} slower ({', '.join(slower)})" if slower else f"none of {loaders} slower"
    console.print(Text(f"gate: {verdict}: exit {status}", style=_gate_style(status)), soft_wrap=True)
    return status


def render_alone(names: list[str], console: Console, prefix: str = "") -> None:
    """A line for each name whose newest run has no earlier run to be compared with."""
    for name in names:
        console.print(Text(f"{prefix}{name}: no earlier run of it to compare with", style="dim"), soft_wrap=True)


def gate_words(gate: Gate) -> str:
    """The gate's verdict in words, with both rates, the drop, the threshold and the runs' spread (or that they keep
    none): "slower: 31.2 -> 22.0 batches/s (-29%), beyond 10% and the runs' spread of 4% (over 5 runs)"."""
    if gate.drop is None or gate.rate_a is None or gate.rate_b is None or gate.unit is None:
        return "no verdict: one of the runs measured no rate to compare"
    threshold = f"{gate.threshold * 100:g}%"
    rates = f"{gate.rate_a:.1f} -> {gate.rate_b:.1f} {_UNITS[gate.unit]} ({(0.0 - gate.drop) * 100:+.0f}%)"
    if gate.spread is None:
        spread = f"no spread of the runs' rate is known, so {threshold} alone decides"
    else:
        spread = (
            f"the runs' spread of {gate.spread * 100:.0f}% ({gate.spread_source or f'over {gate.spread_runs} runs'})"
        )
    verdict = gate.verdict
    if verdict == "slower":
        if gate.spread is None:
            return f"slower: {rates}, beyond {threshold}; {spread}"
        return f"slower: {rates}, beyond {threshold} and {spread}"
    if verdict == "within-spread":
        return f"passed: {rates}, beyond {threshold} but within {spread}"
    if verdict == "within-threshold":
        return f"passed: {rates}, within {threshold}; {spread}"
    return f"passed: {rates}, not slower; {spread}"


def _gate_style(status: int) -> str:
    return "bold red" if status else "bold green"


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
