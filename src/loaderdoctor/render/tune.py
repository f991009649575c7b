"""The console rendering of a TuneReport: every trial in a table, then the chosen settings and their code."""

from __future__ import annotations

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from loaderdoctor.render.console import code_block
from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.space import label
from loaderdoctor.tune.trial import Trial

_VERDICT_STYLE = {"stalled": "bold red", "crashed": "bold red", "other-data": "bold red", "over-memory": "yellow"}


def render(report: TuneReport, console: Console) -> None:
    """Print, per loader, the trial table, the choice against the baseline, and the code to apply it."""
    console.print(Text.assemble(("loaderdoctor tune ", "bold"), (report.target, "bold cyan")))
    for tuning in report.loaders.values():
        console.print()
        console.print(_loader(tuning))


def _loader(tuning: LoaderTuning) -> Group:
    limits = tuning.limits
    memory_gb = limits.memory_bytes / 2**30
    step = "no training step" if tuning.step_ms is None else f"a training step of {tuning.step_ms:.0f} ms"
    context = Text(
        f"  {len(tuning.trials)} trials in {tuning.seconds:.0f} s, {step}; limits: {limits.cores:g} cores, "
        f"{memory_gb:.1f} GB of memory, at most {limits.max_workers} workers"
        + ("; the time budget ended the search" if tuning.stopped == "budget" else ""),
        style="dim",
    )
    return Group(Text(f"loader '{tuning.name}'", style="bold underline"), context, _table(tuning), _choice(tuning))


def _table(tuning: LoaderTuning) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1))
    table.add_column("#", justify="right")
    table.add_column("settings", no_wrap=True)
    table.add_column("batches/s", justify="right")
    table.add_column("vs baseline", justify="right", no_wrap=True)
    table.add_column("memory", justify="right")
    table.add_column("runs", justify="right")
    table.add_column("verdict")
    before = tuning.baseline.batches_per_s
    for trial in tuning.trials:
        chosen = trial is tuning.chosen
        ratio = f"{trial.batches_per_s / before:.2f}x" if trial.runs and before > 0 else ""
        memory = "" if trial.memory_bytes is None else f"{trial.memory_bytes / 2**20:.0f} MB"
        table.add_row(
            str(trial.number),
            label(trial.settings) + (" (baseline)" if trial is tuning.baseline else ""),
            f"{trial.batches_per_s:.1f}" if trial.runs else "",
            ratio,
            memory,
            str(len(trial.runs)),
            _verdict(trial, tuning),
            style="bold green" if chosen else None,
        )
    return table


def _verdict(trial: Trial, tuning: LoaderTuning) -> Text:
    words = "chosen" if trial is tuning.chosen else trial.verdict
    if trial.keeps_up:
        words += ", keeps up"
    text = Text(words, style=_VERDICT_STYLE.get(trial.verdict, ""))
    if trial.note:
        text.append(f": {trial.note}", style="dim")
    return text


def _choice(tuning: LoaderTuning) -> Group:
    if not tuning.found:
        return Group(
            Text(
                "  Nothing tried delivered batches: every trial stalled, crashed or was refused. "
                "Run `loaderdoctor check` on this loader to see why.",
                style="bold red",
            )
        )
    chosen, baseline = tuning.chosen, tuning.baseline
    speedup = tuning.speedup
    if chosen is baseline or chosen.settings == baseline.settings:
        headline = Text("  Your settings are already the best found: keep them.", style="bold green")
        return Group(headline)
    gain = "" if speedup is None else f" {speedup:.2f}x the baseline"
    why = f"{baseline.batches_per_s:.1f} -> {chosen.batches_per_s:.1f} batches/s, medians of the runs"
    if tuning.step_ms is not None and chosen.keeps_up:
        why += f"; the cheapest settings found that keep up with the {tuning.step_ms:.0f} ms step"
    headline = Text.assemble(("  Chosen: ", "bold"), (label(chosen.settings), "bold green"), (f":{gain} ({why})", ""))
    return Group(headline, Padding(code_block(chosen.settings.snippet()), (0, 0, 0, 4)))
