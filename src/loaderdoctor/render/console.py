"""The console rendering of a check Report."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from loaderdoctor.host.facts import program_name
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.words import plural
from loaderdoctor.recording.limit import limit_words
from loaderdoctor.recording.record import NOTABLE_DESCHEDULED_WAIT_S, OtherProcess
from loaderdoctor.render.evidence import evidence_words
from loaderdoctor.render.plan import plan_view
from loaderdoctor.report import NO_RATE, Finding, LoaderReport, Report, Verification, measurements

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_MARK = {"critical": "✖", "warning": "▲", "info": "●"}
_REFRESH_S = 0.1


# Findings about the machine rather than a loader: every loader's recording sees them, a report shows them once.
HOST_RULES = frozenset({"stray-workers"})


# Findings about a distributed job, judged across its ranks (`run` on several ranks, `scale`): a report shows them
# first, under the job's heading, not in the rank's section they were added to.
JOB_RULES = frozenset({"rank-straggler", "job-ceiling"})


def is_job_finding(finding: Finding) -> bool:
    """Whether a finding was judged across the ranks of a job (JOB_RULES, and distributed-sampler across ranks: not
    its set_epoch() warning, which one rank's epochs give)."""
    if finding.rule == "distributed-sampler":
        return "sampler_epoch" not in finding.evidence
    return finding.rule in JOB_RULES


def loader_findings(findings: list[Finding], *, job_apart: bool = True) -> list[Finding]:
    """A loader's own findings, the machine's (HOST_RULES) left to host_findings and, with `job_apart`, the job's
    to job_findings (scale's loaders are the job's already: their findings stay with them)."""
    return [f for f in findings if f.rule not in HOST_RULES and not (job_apart and is_job_finding(f))]


def job_findings(loaders: Iterable[LoaderReport]) -> dict[str, list[Finding]]:
    """The job's findings of a report (see is_job_finding), by the loader they are about: its name without the
    rank ("train.py:41", of "train.py:41/rank0" and its other ranks)."""
    found: dict[str, list[Finding]] = {}
    for lr in loaders:
        for finding in lr.findings:
            if is_job_finding(finding):
                found.setdefault(lr.name.rsplit("/rank", 1)[0], []).append(finding)
    return found


def job_view(findings: dict[str, list[Finding]]) -> Group:
    """The job's findings under a heading of their own, per loader."""
    parts: list[Any] = []
    for name, found in findings.items():
        parts.append(Text(f"the job: loader '{name}' across its ranks", style="bold underline"))
        parts.extend(finding_view(f) for f in found)
    return Group(*parts)


def host_findings(findings_by_loader: Iterable[list[Finding]]) -> list[Finding]:
    """The machine's findings of a report, each rule once, as the last loader measured saw it."""
    latest: dict[str, Finding] = {}
    for findings in findings_by_loader:
        latest.update((f.rule, f) for f in findings if f.rule in HOST_RULES)
    return list(latest.values())


def shown_findings(findings_by_loader: Iterable[list[Finding]]) -> list[Finding]:
    """Every finding a report shows: each loader's own, and the machine's once (what its summary counts)."""
    by_loader = list(findings_by_loader)
    job = [f for findings in by_loader for f in findings if is_job_finding(f)]
    return job + [f for findings in by_loader for f in loader_findings(findings)] + host_findings(by_loader)


def host_view(findings: list[Finding]) -> Group:
    """The machine's findings under a heading of their own."""
    return Group(Text("this machine", style="bold underline"), *(finding_view(f) for f in findings))


def render(report: Report, console: Console) -> None:
    """Print the whole report: what was found across the ranks of a job, first; per loader what was measured, the
    findings, and the verified fix; then what was found about the machine, once."""
    console.print(Text.assemble((f"loaderdoctor {report.command} ", "bold"), (report.target, "bold cyan")))
    job = job_findings(report.loaders.values())
    if job:  # first: the ranks' own sections and the DDP plan follow
        console.print()
        console.print(job_view(job), crop=False)
    for loader_report in report.loaders.values():
        console.print()
        console.print(_loader(loader_report), crop=False)  # code blocks keep their whole lines
    machine = host_findings(lr.findings for lr in report.loaders.values())
    if machine:
        console.print()
        console.print(host_view(machine), crop=False)
    console.print()
    console.print(_verdict(report))


def _loader(lr: LoaderReport) -> Group:
    rec = lr.recording
    parts: list[Any] = [Text(f"loader '{lr.name}'", style="bold underline"), _measured(lr)]
    findings = loader_findings(lr.findings)
    if not findings:
        parts.append(Text("  No problems found.", style="green"))
    for finding in findings:
        parts.append(finding_view(finding))
    if lr.verification is not None:
        parts.append(_verification(rec.settings, lr.verification, rec.loader_class))
    if lr.epoch_cost is not None:
        parts.append(Text(f"  {lr.epoch_cost.words()[0].upper()}{lr.epoch_cost.words()[1:]}.", style="bold"))
    if lr.plan is not None:
        parts.extend([Text(""), plan_view(lr.plan)])
    return Group(*parts)


_NO_STEP = "no training step given: pass --step-ms to judge whether loading keeps up"


def measured_rows(lr: LoaderReport) -> list[tuple[str, str]]:
    """What a loader's run measured, (what, words) per line, as every report (console, HTML) words it."""
    rec = lr.recording
    limit = lr.limit
    m = measurements(rec, limit)
    size = f"{rec.dataset_len} samples, " if rec.dataset_len is not None else ""
    per_epoch = f" ({plural(rec.batches_per_epoch, 'batch')} per epoch)" if rec.batches_per_epoch else ""
    run = f"{plural(m['epochs'], 'epoch')}, {plural(m['batches'], 'batch')} in {m['wall_s']:.1f} s"
    if m["batches_per_s"] is not None:
        run += f": {m['batches_per_s']:.1f} batches/s, {m['samples_per_s']:.0f} samples/s"
    else:
        run += ": too few batches after start-up to measure a rate"
    if rec.outcome != "completed":
        run += f"  ({rec.outcome})"
    rows = [
        *([("ceiling", ceiling)] if (ceiling := ceiling_words(m["ceiling"])) else []),
        ("dataset", f"{rec.dataset}: {size}batch size {rec.batch_size}{per_epoch}"),
        *([("loader", _class_words(rec.loader_class))] if rec.loader_class else []),
        ("settings", rec.settings.describe()),
        ("measured", run),
    ]
    busy = _busy_host(m["other_processes_cores"], rec.host.usable_cores, rec.other_processes)
    if busy:
        rows.append(("machine", busy))
    if m["wait_fraction"] is not None:
        waiting = (
            f"{m['wait_fraction'] * 100:.0f}% of the time ({wait_per_batch(m)}, training step {m['step_ms']:.1f} ms)"
        )
        rows.append(("waiting", waiting))
    else:
        rows.append(("waiting", _NO_STEP))
    rows.append(("limit", limit_words(limit, m["batches_per_s"], lr.fixed_rate)))
    rows.append(("first batch", _first_batches(m["first_batch_s"])))
    if m["worker_uss_mb_max"] is not None:
        rows.append(("workers", f"up to {m['worker_uss_mb_max']:.0f} MB private memory (USS) each"))
    if m["sample_errors"]:
        rows.append(("errors", f"{plural(m['sample_errors'], 'batch')} failed while loading"))
    if rec.worker_deaths:
        where = "; ".join(f"epoch {d.epoch}, batch {d.batch}" for d in rec.worker_deaths[:3])
        more = f" and {len(rec.worker_deaths) - 3} more" if len(rec.worker_deaths) > 3 else ""
        went_on = ", and the loop went on (a guard started workers again)" if rec.outcome == "completed" else ""
        rows.append(("deaths", f"{plural(len(rec.worker_deaths), 'worker')} died ({where}{more}){went_on}"))
    return rows


def ceiling_words(ceiling: dict[str, Any] | None) -> str | None:
    """The data-free turns' measurement in a sentence, first of a loader's rows (None without one)."""
    if ceiling is None:
        return None
    steps = f"{plural(ceiling['data_free_steps'], 'step')} trained on repeated batches"
    if ceiling["speedup"] is None:
        return f"not measured: the run ended before its data-free turns were done ({steps})"
    spread = ceiling["turn_speedups_range"]
    turns = f", turns {spread[0]:.2f}x to {spread[1]:.2f}x" if spread and spread[0] != spread[1] else ""
    return (
        f"the input costs {ceiling['input_cost'] * 100:.0f}% of this job's time: with a perfect input it runs "
        f"{ceiling['speedup']:.2f}x faster ({ceiling['ceiling_batches_per_s']:.1f} against "
        f"{ceiling['real_batches_per_s']:.1f} batches/s in turns{turns}; its waits said "
        f"{ceiling['wait_model_input_cost'] * 100:.0f}%); {steps}"
        + ("" if ceiling["complete"] else " (the run ended before every turn was measured)")
    )


def _measured(lr: LoaderReport) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim", justify="right")
    table.add_column()
    for what, words in measured_rows(lr):
        text = Text(words, style="dim" if words == _NO_STEP else "")
        if what == "measured" and lr.recording.outcome != "completed":
            text.highlight_words([f"({lr.recording.outcome})"], style="bold red")
        table.add_row(what, text)
    return table


def finding_view(finding: Finding) -> Group:
    style = _STYLE[finding.severity]
    head = Text.assemble(
        (f"{_MARK[finding.severity]} {finding.severity:<8} ", style),
        (f"{finding.rule:<21}", "bold"),
        finding.title,
    )
    body: list[Any] = [
        Text.assemble(("evidence  ", "dim"), evidence_words(finding.evidence)),  # in words; key=value in the JSON
        Text.assemble(("fix       ", "dim"), finding.fix),
    ]
    code = []
    if finding.snippet and not finding.settings_change:  # settings changes show in the verified fix instead
        code.append(code_block(finding.snippet, indent=4))
    return Group(Text(""), head, Padding(Group(*body), (0, 0, 0, 4)), *code)


def short_value(value: Any) -> str:
    """An evidence value as the reports show it: 3 significant digits, a long list cut after six."""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list) and len(value) > 6:
        return "[" + ", ".join(short_value(v) for v in value[:6]) + f", … {len(value) - 6} more]"
    if isinstance(value, list):
        return "[" + ", ".join(short_value(v) for v in value) + "]"
    return str(value)


# How each verdict on a fix is headed (see VERDICTS in probe/verification.py), and the mark and style of each head.
VERDICT_HEADS = {
    "faster": "verified fix",
    "quicker-start": "verified fix",
    "as-fast": "verified fix",
    "rescued": "verified fix",
    "no-gain": "no measurable gain",
    "slower": "not a fix",
    "failed": "not a fix",
    "other-data": "not compared",
    "not-measured": "not measured",
}
_HEAD_MARK = {"no measurable gain": "≈", "not a fix": "✘", "not compared": "✘", "not measured": "?"}


def verification_head(before: Settings, v: Verification) -> tuple[str, str]:
    """The verdict's head ('verified fix'; 'verified cause' for a lock proved by its lock-free run) and what was
    changed, in words, as every report heads a verification."""
    if v.source == "lock-free":  # the same settings, measured without the lock: a cause proved
        head = "verified cause" if v.helped else VERDICT_HEADS[v.verdict]
        return head, "the same settings, lock calls on read-only files made no-ops in the workers"
    old, new = before.to_dict(), v.settings.to_dict()
    return VERDICT_HEADS[v.verdict], ", ".join(f"{k}={new[k]!r}" for k in new if new[k] != old[k])


def startup_words(v: Verification) -> str | None:
    """The start-ups of both settings, once per run, where they are not the verdict itself (quicker-start)."""
    if v.before_startup_s is None or v.after_startup_s is None or v.verdict == "quicker-start":
        return None
    return f"start-up {v.before_startup_s:.2f} s → {v.after_startup_s:.2f} s, once per run (not in the rates)"


def ceiling_share_words(v: Verification) -> str | None:
    """The fix's rate as a share of the loop's ceiling, measured in the same rounds ('the loop's ceiling: 49.3
    batches/s with its input taken away (its step on one batch, 6 windows); the fix reaches 68% of it, the
    original 34%'); None without a step to measure it by."""
    if v.ceiling is None:
        return None
    text = (
        f"the loop's ceiling: {v.ceiling:.1f} batches/s with its input taken away (its step on one batch, "
        f"{plural(v.ceiling_windows, 'window')})"
    )
    fixed = v.fixed_share_of_ceiling
    before = v.share_of_ceiling(v.before)
    if fixed is not None:
        text += f"; the fix reaches {fixed:.0%} of it"
    if before is not None:
        text += f"{',' if fixed is not None else ';'} the original {before:.0%}"
    return text


# Other processes that took at least this many cores while loaderdoctor measured are worth saying.
_BUSY_CORES = 0.25


def other_process_words(process: OtherProcess) -> str:
    """'pid 4242 (python3 train_b.py, 1.0 cores)': a process by its program, never its arguments (a report saved
    before kept up to 200 characters of them)."""
    return f"pid {process.pid} ({program_name(process.cmdline.split())}, {process.cores:.1f} cores)"


def _class_words(qualified: str) -> str:
    """ "StatefulDataLoader (torchdata.stateful_dataloader.stateful_dataloader)" for its "module.Name"."""
    module, _, name = qualified[:200].rpartition(".")  # the console makes control characters visible
    return f"{name} ({module})" if module else name


FIRST_BATCHES_SHOWN = 8  # epochs' first batches shown one by one; more are shown as the first and last few


def _first_batches(seconds: list[float | None]) -> str:
    """Each epoch's time to its first batch, from iter(): a long run's as its first three and last two, with their
    median and their longest."""
    shown = ["-" if s is None else f"{s:.2f} s" for s in seconds]
    if len(shown) <= FIRST_BATCHES_SHOWN:
        return f"{', '.join(shown)} (per epoch, from iter())"
    came = sorted(s for s in seconds if s is not None)
    spread = f": median {statistics.median(came):.2f} s, longest {came[-1]:.2f} s" if came else ""
    return f"{', '.join(shown[:3])} ... {', '.join(shown[-2:])} ({len(shown)} epochs{spread}; per epoch, from iter())"


def _busy_host(cores: float | None, usable: float, others: list[OtherProcess]) -> str | None:
    """Other processes' load in words, with the busiest by pid; None when the machine was quiet. Their load is
    the machine's, which can pass this process's usable cores (an affinity mask or a quota): then it is no share
    of them."""
    if cores is None or cores < _BUSY_CORES:
        return None
    if round(cores, 1) <= usable:
        text = f"other processes took {cores:.1f} of the {usable:g} usable cores while this was measured"
    else:
        text = f"other processes kept {cores:.1f} cores of the machine busy while this was measured"
        text += f", more than the {usable:g} this process may use" if usable > 0 else ""
    if others:
        text += ": " + ", ".join(other_process_words(p) for p in others[:3])
    return text


def _verification(before_settings: Settings, v: Verification, loader_class: str = "") -> Group:
    head, change = verification_head(before_settings, v)
    style = "bold green" if v.helped else "bold yellow"
    mark = "✔" if v.helped else _HEAD_MARK.get(head, "✘")
    colour = "green" if v.helped else "yellow"
    lines: list[Any] = [Text.assemble((f"\n{mark} {head}  ", style), change)]
    if v.verdict == "rescued":
        figures = f"{v.before_outcome} → {v.after:.1f} batches/s: "
    elif v.verdict in NO_RATE:
        figures = ""
    else:
        figures = f"{v.before:.1f} → {v.after:.1f} batches/s: "
    lines.append(Padding(Text(figures + v.note, style=colour), (0, 0, 0, 4)))
    for words in (ceiling_share_words(v), startup_words(v)):
        if words is not None:
            lines.append(Padding(Text(words, style="dim"), (0, 0, 0, 4)))
    usable = v.after_recording.host.usable_cores if v.after_recording is not None else 0.0
    busy = _busy_host(v.other_cores, usable, v.other_processes)
    if busy:
        lines.append(Padding(Text(busy.replace("this was", "these were"), style="dim"), (0, 0, 0, 4)))
    if v.helped and v.source != "lock-free":
        lines.append(code_block(v.settings.snippet(loader_class), indent=4))
    return Group(*lines)


def wait_per_batch(m: dict[str, Any]) -> str:
    """The wait per batch in words: the mean (what the wait's share of the time is made of), with the median
    beside it, since waits are often bimodal (most batches ready, every few a long wait)."""
    mean, median = m.get("wait_ms_mean"), m.get("wait_ms_p50")
    if mean is None:  # a report saved before the mean was kept
        return f"median {median:.1f} ms per batch"
    descheduled = m.get("wait_descheduled_ms_mean")
    of_it = ""
    if descheduled is not None and descheduled >= NOTABLE_DESCHEDULED_WAIT_S * 1000:
        of_it = f" ({descheduled:.1f} ms of it descheduled by other processes, not waiting for data)"
    return f"{mean:.1f} ms per batch on average{of_it}, median {median:.1f} ms"


def code_block(snippet: str, indent: int = 0) -> Text:
    """A snippet of Python as the reports show it, `indent` spaces in: highlighted, and each line whole, never
    wrapped or cut at the terminal's width, so that it pastes as it is written (a comment or an expression broken
    over two lines is a SyntaxError). Printed with crop=False, and never inside a Padding (which cuts lines)."""
    highlighted = Syntax(snippet, "python", theme="ansi_dark", background_color="default").highlight(snippet)
    highlighted.rstrip()
    text = Text("\n").join(Text(" " * indent) + line for line in highlighted.split("\n"))
    text.no_wrap, text.overflow = True, "ignore"
    return text


def _verdict(report: Report) -> Text:
    counts = {s: 0 for s in _STYLE}
    for f in shown_findings(lr.findings for lr in report.loaders.values()):
        counts[f.severity] += 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no findings"
    style = "bold red" if counts["critical"] else "yellow" if counts["warning"] else "green"
    return Text(f"Summary: {summary}.", style=style)
