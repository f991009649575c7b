"""The console rendering of a check Report."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from loaderdoctor.recording import Recording, measurements
from loaderdoctor.report import Finding, LoaderReport, Report, Verification
from loaderdoctor.settings import Settings

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_MARK = {"critical": "✖", "warning": "▲", "info": "●"}
_REFRESH_S = 0.1


def render(report: Report, console: Console) -> None:
    """Print the whole report: per loader what was measured, the findings, and the verified fix."""
    console.print(Text.assemble(("loaderdoctor check ", "bold"), (report.target, "bold cyan")))
    for loader_report in report.loaders.values():
        console.print()
        console.print(_loader(loader_report))
    console.print()
    console.print(_verdict(report))


def _loader(lr: LoaderReport) -> Group:
    rec = lr.recording
    parts: list[Any] = [Text(f"loader '{lr.name}'", style="bold underline"), _measured(rec)]
    if not lr.findings:
        parts.append(Text("  No problems found.", style="green"))
    for finding in lr.findings:
        parts.append(_finding(finding))
    if lr.verification is not None:
        parts.append(_verification(rec.settings, lr.verification))
    return Group(*parts)


def _describe_settings(settings: Settings, start_method: str | None) -> str:
    if settings.num_workers == 0:
        return "num_workers=0 (loading runs in the training process)"
    text = f"num_workers={settings.num_workers}, persistent_workers={settings.persistent_workers}"
    text += f", prefetch_factor={settings.prefetch_factor or 2}, start method {start_method}"
    if settings.pin_memory:
        text += ", pin_memory=True"
    if settings.worker_threads:
        text += f", {settings.worker_threads} thread(s) per worker"
    return text


def _measured(rec: Recording) -> Table:
    m = measurements(rec)
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim", justify="right")
    table.add_column()
    size = f"{rec.dataset_len} samples, " if rec.dataset_len is not None else ""
    per_epoch = f" ({rec.batches_per_epoch} batches per epoch)" if rec.batches_per_epoch else ""
    table.add_row("dataset", f"{rec.dataset}: {size}batch size {rec.batch_size}{per_epoch}")
    table.add_row("settings", _describe_settings(rec.settings, rec.start_method))
    run = f"{m['epochs']} epoch(s), {m['batches']} batches in {m['wall_s']:.1f} s"
    run += f": {m['batches_per_s']:.1f} batches/s, {m['samples_per_s']:.0f} samples/s"
    if rec.outcome != "completed":
        run += f"  [bold red]({rec.outcome})[/]"
    table.add_row("measured", run)
    if m["wait_fraction"] is not None:
        table.add_row(
            "waiting",
            f"{m['wait_fraction'] * 100:.0f}% of the time (median {m['wait_ms_p50']:.1f} ms per batch, "
            f"training step {m['step_ms']:.1f} ms)",
        )
    else:
        table.add_row("waiting", "[dim]no training step given: pass --step-ms to judge whether loading keeps up[/]")
    firsts = ", ".join("-" if s is None else f"{s:.2f} s" for s in m["first_batch_s"])
    table.add_row("first batch", f"{firsts} (per epoch, from iter())")
    if m["worker_uss_mb_max"] is not None:
        table.add_row("workers", f"up to {m['worker_uss_mb_max']:.0f} MB private memory (USS) each")
    if m["sample_errors"]:
        table.add_row("errors", f"{m['sample_errors']} batch(es) failed while loading")
    return table


def _finding(finding: Finding) -> Group:
    style = _STYLE[finding.severity]
    head = Text.assemble(
        (f"{_MARK[finding.severity]} {finding.severity:<8} ", style),
        (f"{finding.rule:<21}", "bold"),
        finding.title,
    )
    evidence = ", ".join(f"{k}={_short(v)}" for k, v in finding.evidence.items())
    body: list[Any] = [
        Text.assemble(("evidence  ", "dim"), evidence),
        Text.assemble(("fix       ", "dim"), finding.fix),
    ]
    if finding.snippet and not finding.settings_change:  # settings changes show in the verified fix instead
        body.append(code_block(finding.snippet))
    return Group(Text(""), head, Padding(Group(*body), (0, 0, 0, 4)))


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list) and len(value) > 6:
        return "[" + ", ".join(_short(v) for v in value[:6]) + f", … {len(value) - 6} more]"
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def _changed(before: Settings, after: Settings) -> str:
    old, new = before.to_dict(), after.to_dict()
    return ", ".join(f"{k}={new[k]!r}" for k in new if new[k] != old[k])


def _verification(before_settings: Settings, v: Verification) -> Group:
    change = _changed(before_settings, v.settings)
    if v.helped:
        title = Text.assemble(("\n✔ verified fix  ", "bold green"), change)
        figures = f"{v.before:.1f} → {v.after:.1f} batches/s"
        lines: list[Any] = [
            title,
            Padding(Text(f"{figures}: {v.note}", style="green"), (0, 0, 0, 4)),
            Padding(code_block(v.settings.snippet()), (0, 0, 0, 4)),
        ]
        return Group(*lines)
    title = Text.assemble(("\n✘ not a fix  ", "bold yellow"), change)
    figures = f"{v.before:.1f} → {v.after:.1f} batches/s: {v.note}"
    return Group(title, Padding(Text(figures, style="yellow"), (0, 0, 0, 4)))


def code_block(snippet: str) -> Syntax:
    """A snippet of Python as the reports show it."""
    return Syntax(snippet, "python", theme="ansi_dark", background_color="default", word_wrap=True)


def _verdict(report: Report) -> Text:
    counts = {s: 0 for s in _STYLE}
    for lr in report.loaders.values():
        for f in lr.findings:
            counts[f.severity] += 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no findings"
    style = "bold red" if counts["critical"] else "yellow" if counts["warning"] else "green"
    return Text(f"Summary: {summary}.", style=style)
