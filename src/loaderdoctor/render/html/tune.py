"""A TuneReport as an HTML page: per loader the choice first (against the baseline, with its code), then every
trial: rate against workers and backend, memory, the chosen one marked, and the table of trials."""

from __future__ import annotations

from loaderdoctor.plain.words import plural
from loaderdoctor.render.html.page import code, data_table, document, facts_table, section, verdict_box
from loaderdoctor.render.html.svg import Highlight, Series, line_chart
from loaderdoctor.render.tune import limit_words, trial_cells
from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.trial import Trial


def page(report: TuneReport) -> str:
    return document(
        f"loaderdoctor tune {report.target}",
        f"loaderdoctor tune {report.target}",
        f"{plural(len(report.loaders), 'loader')} tuned",
        [_loader(tuning) for tuning in report.loaders.values()],
    )


def _loader(tuning: LoaderTuning) -> str:
    limits = tuning.limits
    step = "no training step" if tuning.step_ms is None else f"a training step of {tuning.step_ms:.0f} ms"
    context = [
        ("search", f"{plural(len(tuning.trials), 'trial')} in {tuning.seconds:.0f} s, stopped: {tuning.stopped}"),
        ("step", step),
        (
            "limits",
            f"{limits.cores:g} cores, {limits.memory_bytes / 2**30:.1f} GB of memory, "
            f"at most {plural(limits.max_workers, 'worker')}",
        ),
        ("host's limit", limit_words(tuning)),
    ]
    parts = [
        _choice(tuning),
        "<h3>Search</h3>" + facts_table(context),
        "<h3>Rate of each trial</h3>" + _rate_chart(tuning),
        "<h3>Memory of each trial</h3>" + _memory_chart(tuning),
        "<h3>Trials</h3>" + _table(tuning),
    ]
    return section(f"loader '{tuning.name}'", parts, "loader")


def _choice(tuning: LoaderTuning) -> str:
    if not tuning.found:
        return verdict_box(
            "critical",
            "nothing found",
            "Nothing tried delivered batches: every trial stalled, crashed or was refused.",
            ["Run `loaderdoctor check` on this loader to see why."],
        )
    chosen, baseline = tuning.chosen, tuning.baseline
    if chosen is baseline or chosen.settings == baseline.settings:
        return verdict_box("good", "keep", "Your settings are already the best found: keep them.")
    speedup = tuning.speedup
    gain = "" if speedup is None else f": {speedup:.2f}x the baseline"
    why = f"{baseline.batches_per_s:.1f} → {chosen.batches_per_s:.1f} batches/s, medians of the runs"
    if tuning.step_ms is not None and chosen.keeps_up:
        why += f"; the cheapest settings found that keep up with the {tuning.step_ms:.0f} ms step"
    return verdict_box("good", "chosen", chosen.settings.describe() + gain, [why], code(tuning.snippet()))


# Each kind of loading in the same colour on every chart.
_KINDS = {"main process": "s0", "worker processes": "s1", "threads": "s2"}


def _kind(trial: Trial) -> str:
    settings = trial.settings
    if settings.backend == "thread":
        return "threads"
    return "worker processes" if settings.num_workers else "main process"


def _points(tuning: LoaderTuning, value) -> list[Series]:
    groups: dict[str, list[tuple[float, float, str]]] = {}
    for trial in tuning.trials:
        y = value(trial)
        if y is None:
            continue
        title = f"#{trial.number} {trial.settings.describe()}: {_figures(trial)} ({trial.verdict})"
        groups.setdefault(_kind(trial), []).append((float(trial.settings.num_workers), y, title))
    return [Series(kind, tuple(groups[kind]), css, joined=False) for kind, css in _KINDS.items() if kind in groups]


def _figures(trial: Trial) -> str:
    rate = f"{trial.batches_per_s:.1f} batches/s" if trial.runs else "not run"
    memory = "" if trial.memory_bytes is None else f", {trial.memory_bytes / 2**20:.0f} MB"
    return rate + memory


def _rate_chart(tuning: LoaderTuning) -> str:
    series = _points(tuning, lambda t: t.batches_per_s if t.runs else None)
    if not series:
        return '<p class="muted">No trial ran.</p>'
    chosen = tuning.chosen
    rings = (
        [Highlight(float(chosen.settings.num_workers), chosen.batches_per_s, f"chosen #{chosen.number}")]
        if tuning.found
        else []
    )
    return line_chart(
        series, label=f"rate of each trial of '{tuning.name}'", x_label="workers", y_label="batches/s", highlights=rings
    )


def _memory_chart(tuning: LoaderTuning) -> str:
    series = _points(tuning, lambda t: None if t.memory_bytes is None else t.memory_bytes / 2**20)
    if not series:
        return '<p class="muted">No trial measured its memory.</p>'
    chosen = tuning.chosen
    rings = []
    if tuning.found and chosen.memory_bytes is not None:
        rings.append(
            Highlight(float(chosen.settings.num_workers), chosen.memory_bytes / 2**20, f"chosen #{chosen.number}")
        )
    return line_chart(
        series,
        label=f"loading's peak memory per trial of '{tuning.name}'",
        x_label="workers",
        y_label="MB",
        highlights=rings,
    )


def _table(tuning: LoaderTuning) -> str:
    rows = [[*trial_cells(trial, tuning), trial.note] for trial in tuning.trials]
    marked = [n for n, trial in enumerate(tuning.trials) if trial is tuning.chosen]
    header = ["#", "settings", "batches/s", "speedup", "memory", "runs", "verdict", "note"]
    return data_table(header, rows, numeric=(0, 2, 3, 4, 5), marked=marked)
