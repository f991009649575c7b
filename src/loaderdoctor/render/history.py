"""The console rendering of the run history: a table of runs, and one run in detail (both from
RunRecord.to_dict())."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from loaderdoctor.history.records import parse_iso
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.words import plural
from loaderdoctor.render.columns import Justify, cell_width, column_widths, cut, line, line_width
from loaderdoctor.render.console import finding_view, wait_per_batch
from loaderdoctor.report import Finding

WHERE_RUNS_COME_FROM = "every run of loaderdoctor watch, check, tune and scale is kept there"
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_DATASET_WORDS = ("name", "len", "batch_size", "batches_per_epoch")  # the keys of RunRecord.dataset said in words


def render_runs(runs: list[dict[str, Any]], where: str, name: str | None, console: Console) -> None:
    """Print the runs (newest first), laid out for the console's width with no word broken: a table of one line
    per run where the main finding still has room (120 columns and more, as a rule); else each run's main finding
    on a line of its own under its row (80 columns); else, where even a row does not fit, a record per run."""
    if not runs:
        named = f" named '{name}'" if name is not None else ""
        console.print(f"No runs{named} in the history at {escape(where)} yet: {WHERE_RUNS_COME_FROM}.", soft_wrap=True)
        return
    rows = [_row(run) for run in runs]
    widths = column_widths([list(_HEADERS), *rows])
    room = console.width - line_width(widths, _GAP) - _GAP
    longest = max(cell_width(_main_finding(run.get("findings") or [], console.width)) for run in runs)
    if room >= min(_WIDE_FINDING_MIN, longest):
        console.print(line([*_HEADERS, "main finding"], [*widths, room], _JUSTIFY_WIDE, _GAP), style="bold")
        for run, row in zip(runs, rows, strict=True):
            finding = _main_finding(run.get("findings") or [], room)
            console.print(line([*_styled(row), finding], [*widths, room], _JUSTIFY_WIDE, _GAP))
    elif line_width(widths, _GAP) <= console.width:
        console.print(line(list(_HEADERS), widths, _JUSTIFY, _GAP), style="bold")
        console.print(Text(" " * _INDENT + "main finding", style="bold", no_wrap=True))
        for run, row in zip(runs, rows, strict=True):
            console.print(line(_styled(row), widths, _JUSTIFY, _GAP))
            console.print(_finding_line(run, console.width))
    else:
        for run, (when, run_id, run_name, kind, settings, rate, waiting) in zip(runs, rows, strict=True):
            console.print(Text.assemble(f"{run_id}  ", (run_name, "bold"), f"  {kind}, {when}"))
            figures = f"{settings}: {rate} batches/s, waiting {waiting}"
            console.print(Text(" " * _INDENT + cut(figures, console.width - _INDENT), no_wrap=True))
            console.print(_finding_line(run, console.width))
    console.print(
        f"[dim]{plural(len(runs), 'run')}, newest first; `loaderdoctor history show ID` shows one in detail[/]"
    )


_HEADERS = ("when", "id", "name", "kind", "settings", "batches/s", "waiting")
_JUSTIFY: tuple[Justify, ...] = ("left", "right", "left", "left", "left", "right", "right")
_JUSTIFY_WIDE: tuple[Justify, ...] = (*_JUSTIFY, "left")
# The table keeps a main finding in its row where this many columns are left for it; else it takes a line.
_WIDE_FINDING_MIN = 40
_GAP = 1  # between the table's columns
_INDENT = 4


def _row(run: dict[str, Any]) -> list[str]:
    """A run's cells but its main finding, in words, each on one line: when, id, name, kind, settings, rate, wait."""
    measured = run.get("measurements") or {}
    return [
        local_time(run["started_at"]),
        str(run["id"]),
        " ".join(str(run["name"]).split()),  # a name's newlines or tabs would break the row
        run["kind"],
        settings_words(run.get("settings") or {}, brief=True),
        _number(measured.get("batches_per_s"), "{:.1f}"),
        _percent(measured.get("wait_fraction")),
    ]


def _styled(row: list[str]) -> list[str | Text]:
    """A row's cells with the name in bold."""
    return [Text(cell, style="bold") if index == 2 else cell for index, cell in enumerate(row)]


def _finding_line(run: dict[str, Any], width: int) -> Text:
    """A run's main finding on a line of its own, indented under its row."""
    return Text(" " * _INDENT, no_wrap=True).append_text(_main_finding(run.get("findings") or [], width - _INDENT))


def render_run(run: dict[str, Any], console: Console) -> None:
    """Print one run: what ran where and when, the host, its settings, what was measured, and its findings."""
    heading = Text.assemble((f"run {run['id']} ", "bold"), (run["name"], "bold cyan"), f"  ({run['kind']})")
    console.print(heading, soft_wrap=True)
    facts = _grid()
    if run.get("target"):
        facts.add_row("target", escape(run["target"]))
    facts.add_row("when", span_words(run["started_at"], run["ended_at"]))
    if run.get("dataset"):
        facts.add_row("dataset", _dataset(run["dataset"]))
    facts.add_row("settings", _settings(run.get("settings") or {}, brief=False))
    console.print(facts)
    if run.get("host"):
        console.print(Text("host", style="bold"))
        console.print(Padding(_generic(run["host"]), (0, 0, 0, 2)))
    console.print(Text("measured", style="bold"))
    console.print(Padding(_measured(run.get("measurements") or {}), (0, 0, 0, 2)))
    findings = run.get("findings") or []
    if not findings:
        console.print(Text("No problems found.", style="green"))
    for finding in findings:
        console.print(_finding(finding), crop=False)  # code blocks keep their whole lines


def local_time(text: str, seconds: bool = False) -> str:
    """An ISO 8601 moment in the local time zone: '2026-11-23 14:02' (':05' more with seconds)."""
    try:
        moment = parse_iso(text).astimezone()
    except ValueError:
        return text
    return moment.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def span_words(started_at: str, ended_at: str) -> str:
    try:
        duration_s = (parse_iso(ended_at) - parse_iso(started_at)).total_seconds()
    except ValueError:
        return f"{started_at} to {ended_at}"
    start, end = local_time(started_at, seconds=True), local_time(ended_at, seconds=True)
    if start[:10] == end[:10]:  # the same day: the end's time alone
        end = end[11:]
    return f"{start} to {end} ({duration_s:.1f} s)"


def _grid() -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim", justify="right", no_wrap=True)
    table.add_column()
    return table


def _settings(settings: dict[str, Any], brief: bool) -> str:
    """settings_words() with rich's markup escaped."""
    return escape(settings_words(settings, brief))


def settings_words(settings: dict[str, Any], brief: bool) -> str:
    """Settings in words ("4 workers"; in full with brief=False), or as key=value where they are not Settings."""
    if not settings:  # a scale run: each rank's own
        return "-"
    known = {field.name for field in dataclasses.fields(Settings)}
    try:
        parsed = Settings.from_dict({key: value for key, value in settings.items() if key in known})
    except Exception:  # a record from another version of loaderdoctor: show what it says
        return short_words(settings) or "-"
    return parsed.brief() if brief else parsed.describe()


def _dataset(dataset: dict[str, Any]) -> str:
    return escape(dataset_words(dataset))


def dataset_words(dataset: dict[str, Any]) -> str:
    """What a run loaded, in words: 'Noisy, 10,000 samples, batch size 32, 313 batches per epoch'."""
    words = [str(dataset["name"])] if dataset.get("name") else []
    if dataset.get("len") is not None:
        words.append(f"{dataset['len']:,} samples")
    if dataset.get("batch_size") is not None:
        words.append(f"batch size {dataset['batch_size']}")
    if dataset.get("batches_per_epoch"):
        words.append(f"{plural(dataset['batches_per_epoch'], 'batch')} per epoch")
    rest = {
        key: value for key, value in dataset.items() if key not in ("name", "len", "batch_size", "batches_per_epoch")
    }
    if rest:
        words.append(short_words(rest))
    return ", ".join(words)


def measured_rows(m: dict[str, Any]) -> list[tuple[str, str]]:
    """The main measurements of a run's record in words, (what, words) per line; --json has every one."""
    rows = []
    if m.get("batches_per_s") is not None:
        rate = f"{m['batches_per_s']:.1f} batches/s"
        if m.get("samples_per_s") is not None:
            rate += f", {m['samples_per_s']:.0f} samples/s"
        rows.append(("rate", rate))
    elif m.get("samples_per_s") is not None:  # a scale run: its ranks' aggregate
        rows.append(("rate", f"{m['samples_per_s']:.1f} samples/s"))
    if m.get("ranks") is not None:
        efficiency = "" if m.get("efficiency") is None else f", scaling efficiency {m['efficiency']:.2f}"
        rows.append(("ranks", f"{m['ranks']}{efficiency}"))
    if m.get("chosen_settings"):  # a tune run: what it chose over the settings measured
        chosen = settings_words(m["chosen_settings"], brief=False)
        if m.get("chosen_batches_per_s") is not None:
            chosen += f": {m['chosen_batches_per_s']:.1f} batches/s"
        if m.get("speedup") is not None:
            chosen += f", {m['speedup']:.2f}x"
        rows.append(("chosen", chosen))
    if m.get("wait_fraction") is not None:
        waiting = f"{m['wait_fraction'] * 100:.0f}% of the time"
        details = []
        if m.get("wait_ms_p50") is not None:
            details.append(wait_per_batch(m))
        if m.get("step_ms") is not None:
            details.append(f"training step {m['step_ms']:.1f} ms")
        rows.append(("waiting", waiting + (f" ({', '.join(details)})" if details else "")))
    if m.get("batches") is not None:
        run = plural(m["batches"], "batch")
        if m.get("epochs") is not None:
            run = f"{plural(m['epochs'], 'epoch')}, {run}"
        if m.get("wall_s") is not None:
            run += f" in {m['wall_s']:.1f} s"
        rows.append(("ran", run))
    if m.get("first_batch_s"):
        firsts = ", ".join("-" if s is None else f"{s:.2f} s" for s in m["first_batch_s"])
        rows.append(("first batch", f"{firsts} (per epoch)"))
    if m.get("worker_uss_mb_max") is not None:
        rows.append(("workers", f"up to {m['worker_uss_mb_max']:.0f} MB private memory (USS) each"))
    if m.get("sample_errors"):
        rows.append(("errors", f"{plural(m['sample_errors'], 'batch')} failed while loading"))
    if m.get("outcome") not in (None, "completed"):
        rows.append(("outcome", str(m["outcome"])))
    return rows


def _measured(m: dict[str, Any]) -> Table:
    table = _grid()
    for what, words in measured_rows(m):
        table.add_row(what, f"[bold red]{escape(words)}[/]" if what == "outcome" else escape(words))
    if not table.rows:
        table.add_row("", "[dim]nothing measured[/]")
    return table


def _generic(facts: dict[str, Any]) -> Table:
    """Any dict as key: value lines; a list of records (processes, say) one per line."""
    table = _grid()
    for key, value in facts.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            table.add_row(escape(str(key)), "\n".join(escape(short_words(item)) for item in value))
        else:
            table.add_row(escape(str(key)), escape(short_words(value)))
    return table


def finding_from_record(data: dict[str, Any]) -> Finding | None:
    """A finding as the history keeps it (Finding.to_dict()), or None where it is not one (another version's)."""
    try:
        return Finding(
            rule=data["rule"],
            severity=data["severity"],
            title=data["title"],
            evidence=data.get("evidence") or {},
            fix=data.get("fix") or "",
            snippet=data.get("snippet"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _finding(data: dict[str, Any]) -> RenderableType:
    finding = finding_from_record(data)
    return Group(Text(""), Text(short_words(data))) if finding is None else finding_view(finding)


def _main_finding(findings: list[dict[str, Any]], width: int) -> Text:
    """The first finding as 'rule: title (+N more)' in at most `width` columns, in its severity's colour; the title
    cut at a word with an ellipsis, the rule and the count of the others whole."""
    if not findings:
        return Text("none", style="green")
    main = findings[0]
    more = f" (+{len(findings) - 1})" if len(findings) > 1 else ""
    text = cut(f"{main.get('rule', '?')}: {main.get('title', '')}", width - cell_len(more)) + more
    return Text(" ".join(text.split()), style=_SEVERITY_STYLE.get(main.get("severity", ""), ""))


def _number(value: Any, form: str) -> str:
    return "-" if value is None else form.format(value)


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def short_words(value: Any) -> str:
    """A value in few words: numbers to 3 significant digits, dicts as key=value, lists as a, b, c."""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{key}={short_words(item)}" for key, item in value.items())
    if isinstance(value, list):
        return ", ".join(short_words(item) for item in value) if value else "none"
    return str(value)
