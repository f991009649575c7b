"""The console rendering of a TuneReport: every trial in a table, then the chosen settings and their code."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.text import Text

from loaderdoctor.plain.words import plural
from loaderdoctor.recording.limit import reaches_limit
from loaderdoctor.render.columns import GAP, Justify, column_widths, line, line_width
from loaderdoctor.render.console import code_block
from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.trial import Trial

_NOT_COMPARED = ("other-data", "stalled", "crashed")
_VERDICT_STYLE = {"stalled": "bold red", "crashed": "bold red", "other-data": "bold red", "over-memory": "yellow"}


def render(report: TuneReport, console: Console) -> None:
    """Print, per loader, the trial table, the choice against the baseline, and the code to apply it."""
    console.print(Text.assemble(("loaderdoctor tune ", "bold"), (report.target, "bold cyan")))
    for tuning in report.loaders.values():
        console.print()
        console.print(_loader(tuning, console.width), crop=False)  # code blocks keep their whole lines


_STOPPED = {
    "budget": "; the time budget ended the search",
    "interrupted": "; Ctrl-C ended the search: nothing chosen, the trials so far shown",
}


def _loader(tuning: LoaderTuning, width: int) -> Group:
    limits = tuning.limits
    memory_gb = limits.memory_bytes / 2**30
    step = "no training step" if tuning.step_ms is None else f"a training step of {tuning.step_ms:.0f} ms"
    context = Text(
        f"{plural(len(tuning.trials), 'trial')} in {tuning.seconds:.0f} s, {step}; limits: {limits.cores:g} "
        f"cores, {memory_gb:.1f} GB of memory, at most {plural(limits.max_workers, 'worker')}"
        + _STOPPED.get(tuning.stopped, ""),
        style="dim",
    )
    parts = [Text(f"loader '{tuning.name}'", style="bold underline"), _indented(context), _table(tuning, width)]
    parts.extend(_notes(tuning))
    parts.append(_choice(tuning))
    return Group(*parts)


def _table(tuning: LoaderTuning, width: int) -> Group:
    """One row per trial where the settings fit beside the figures (120 columns, as a rule); else two lines per
    trial, the figures over the settings (80 columns). The trials' notes follow on lines of their own."""
    rows = [trial_cells(trial, tuning) for trial in tuning.trials]
    widths = column_widths([list(_HEADERS), *rows])
    lines: list[Any] = []
    if line_width(widths) <= width:
        lines.append(line(_HEADERS, widths, _JUSTIFY, style="bold"))
        for trial, cells in zip(tuning.trials, rows, strict=True):
            lines.append(line(_styled(trial, cells, tuning), widths, _JUSTIFY, style=_row_style(trial, tuning)))
        return Group(*lines)
    figures = [0, 2, 3, 4, 5, 6]  # the columns but the settings, which take the next line
    narrow = [widths[i] for i in figures]
    justify = [_JUSTIFY[i] for i in figures]
    lines.append(line([_HEADERS[i] for i in figures], narrow, justify, style="bold"))
    under = narrow[0] + GAP  # the settings start under the figures' first column
    lines.append(Text(" " * under + _HEADERS[1], style="bold"))
    for trial, cells in zip(tuning.trials, rows, strict=True):
        style = _row_style(trial, tuning)
        lines.append(line([_styled(trial, cells, tuning)[i] for i in figures], narrow, justify, style=style))
        lines.append(Padding(Text(cells[1], style=style or ""), (0, 0, 0, under)))
    return Group(*lines)


_HEADERS = ("#", "settings", "batches/s", "speedup", "memory", "runs", "verdict")
_JUSTIFY: tuple[Justify, ...] = ("right", "left", "right", "right", "right", "right", "left")


def _row_style(trial: Trial, tuning: LoaderTuning) -> str | None:
    return "bold green" if trial is tuning.chosen else None


def _styled(trial: Trial, cells: list[str], tuning: LoaderTuning) -> list[str | Text]:
    """A trial's cells with its verdict in the verdict's colour."""
    return [*cells[:-1], Text(cells[-1], style=_VERDICT_STYLE.get(trial.verdict, ""))]


def trial_cells(trial: Trial, tuning: LoaderTuning) -> list[str]:
    """A trial's row, as every report words it: number, settings, batches/s, speedup over the baseline, memory,
    runs, verdict ("chosen" for the choice; ", keeps up" when it kept up with the step)."""
    before = tuning.baseline.batches_per_s
    # No ratio to the baseline for other data, or for settings that stalled or crashed.
    comparable = trial.runs and before > 0 and trial.verdict not in _NOT_COMPARED
    verdict = "chosen" if trial is tuning.chosen else trial.verdict
    if trial.keeps_up:
        verdict += ", keeps up"
    return [
        str(trial.number),
        trial.settings.describe() + (" (baseline)" if trial is tuning.baseline else ""),
        f"{trial.batches_per_s:.1f}" if trial.runs else "",
        f"{trial.batches_per_s / before:.2f}x" if comparable else "",
        "" if trial.memory_bytes is None else f"{trial.memory_bytes / 2**20:.0f} MB",
        str(len(trial.runs)),
        verdict,
    ]


def _indented(text: Text) -> Padding:
    """Text two columns in, its wrapped lines too."""
    return Padding(text, (0, 0, 0, 2))


def _notes(tuning: LoaderTuning) -> list[Padding]:
    """What the table's verdicts rest on, one line (wrapped as needed) per trial that has a note."""
    return [
        _indented(Text.assemble((f"#{trial.number} {trial.verdict}: ", "dim bold"), (trial.note, "dim")))
        for trial in tuning.trials
        if trial.note
    ]


def _choice(tuning: LoaderTuning) -> Group:
    if not tuning.found:
        nothing = Text(
            "Nothing tried delivered batches: every trial stalled, crashed or was refused. "
            "Run `loaderdoctor check` on this loader to see why.",
            style="bold red",
        )
        return Group(_indented(nothing))
    chosen, baseline = tuning.chosen, tuning.baseline
    speedup = tuning.speedup
    if chosen is baseline or chosen.settings == baseline.settings:
        return Group(_indented(Text("Your settings are already the best found: keep them.", style="bold green")))
    gain = "" if speedup is None else f" {speedup:.2f}x the baseline"
    why = f"{baseline.batches_per_s:.1f} -> {chosen.batches_per_s:.1f} batches/s, medians of the runs"
    if tuning.step_ms is not None and chosen.keeps_up:
        why += f"; the cheapest settings found that keep up with the {tuning.step_ms:.0f} ms step"
    headline = Text.assemble(("Chosen: ", "bold"), (chosen.settings.describe(), "bold green"), (f":{gain} ({why})", ""))
    return Group(_indented(headline), _indented(_limit(tuning)), code_block(tuning.snippet(), indent=4))


BINDS_WORDS = {"loading-cpu": "loading's CPU binds", "loading-io": "loading's waits bind", "step": "the step binds"}


def limit_words(tuning: LoaderTuning) -> str:
    """'39.1 batches/s (loading's CPU binds, measured in trial 4); the baseline at 41% and the choice at 96% of
    it', or why it is unknown (the terminal's and the HTML page's words alike)."""
    limit = tuning.limit_dict()
    if limit is None:
        return "unknown (no trial with worker processes measured it)"
    binds = BINDS_WORDS.get(limit["binds"] or "", "what binds is unknown")
    text = f"{limit['batches_per_s']:.1f} batches/s ({binds}, measured in trial {limit['trial']})"
    shares = [
        (what, tuning.share_of_limit(trial))
        for what, trial in (("the baseline", tuning.baseline), ("the choice", tuning.chosen))
    ]
    # From 100% on a share is at the limit (reaches_limit); threads can pass a limit worker processes measured.
    past = "past it" if limit["note"] else "at it"
    known = [
        f"{what} {past}" if reaches_limit(share) else f"{what} at {share:.0%} of it"
        for what, share in shares
        if share is not None
    ]
    if known:
        text += "; " + " and ".join(known)
    if limit["note"]:
        text += f" (the limit was {limit['note']})"
    return text


def _limit(tuning: LoaderTuning) -> Text:
    return Text(f"this host's limit: {limit_words(tuning)}", style="dim")
