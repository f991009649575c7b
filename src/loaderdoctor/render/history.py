"""The console rendering of the run history: a table of runs, and one run in detail (both from
RunRecord.to_dict())."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from loaderdoctor.history.records import parse_iso
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.words import plural
from loaderdoctor.render.console import finding_view, wait_per_batch
from loaderdoctor.report import Finding

WHERE_RUNS_COME_FROM = "every run of loaderdoctor watch, check, tune and scale is kept there"
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_FINDING_CHARS = 60
_DATASET_WORDS = ("name", "len", "batch_size", "batches_per_epoch")  # the keys of RunRecord.dataset said in words


def render_runs(runs: list[dict[str, Any]], where: str, name: str | None, console: Console) -> None:
    """Print the runs (newest first) as a table, one line each; or, with none, where the history is."""
    if not runs:
        named = f" named '{name}'" if name is not None else ""
        console.print(f"No runs{named} in the history at {escape(where)} yet: {WHERE_RUNS_COME_FROM}.", soft_wrap=True)
        return
    table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column("when", no_wrap=True)
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("name", style="bold", overflow="fold")
    table.add_column("kind", no_wrap=True)
    table.add_column("settings", overflow="fold")
    table.add_column("batches/s", justify="right", no_wrap=True)
    table.add_column("waiting", justify="right", no_wrap=True)
    table.add_column("main finding", overflow="fold", ratio=1)
    for run in runs:
        measured = run.get("measurements") or {}
        table.add_row(
            local_time(run["started_at"]),
            str(run["id"]),
            escape(run["name"]),
            run["kind"],
            _settings(run.get("settings") or {}, brief=True),
            _number(measured.get("batches_per_s"), "{:.1f}"),
            _percent(measured.get("wait_fraction")),
            _main_finding(run.get("findings") or []),
        )
    console.print(table)
    console.print(
        f"[dim]{plural(len(runs), 'run')}, newest first; `loaderdoctor history show ID` shows one in detail[/]"
    )


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


def _main_finding(findings: list[dict[str, Any]]) -> str:
    if not findings:
        return "[green]none[/]"
    main = findings[0]
    text = f"{main.get('rule', '?')}: {main.get('title', '')}"
    if len(findings) > 1:
        text += f" (+{len(findings) - 1})"
    if len(text) > _FINDING_CHARS:
        text = text[: _FINDING_CHARS - 1].rstrip() + "…"
    style = _SEVERITY_STYLE.get(main.get("severity", ""), "")
    return f"[{style}]{escape(text)}[/]" if style else escape(text)


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
