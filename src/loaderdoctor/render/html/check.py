"""A check Report as an HTML page: per loader the verdict first (the main finding, its evidence and fix, the
verified before/after), then the figures, the timelines before and after, the rate per epoch, workers' memory."""

from __future__ import annotations

from loaderdoctor.plain.words import plural
from loaderdoctor.recording.record import Recording
from loaderdoctor.render.console import (
    ceiling_share_words,
    host_findings,
    job_findings,
    loader_findings,
    measured_rows,
    other_process_words,
    short_value,
    shown_findings,
    startup_words,
    verification_head,
)
from loaderdoctor.render.html.page import code, document, facts_table, section, verdict_box
from loaderdoctor.render.html.plan import plan_block
from loaderdoctor.render.html.timeline import epoch_rates, timeline, timeline_peak_ms, worker_memory
from loaderdoctor.report import NO_RATE, Finding, LoaderReport, Report, Verification


def page(report: Report) -> str:
    shown = shown_findings(lr.findings for lr in report.loaders.values())
    counts = {s: sum(f.severity == s for f in shown) for s in _SEVERITIES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no findings"
    machine = host_findings(lr.findings for lr in report.loaders.values())
    return document(
        f"loaderdoctor {report.command} {report.target}",
        f"loaderdoctor {report.command} {report.target}",
        f"{plural(len(report.loaders), 'loader')}; summary: {summary}",
        [job_section(name, found) for name, found in job_findings(report.loaders.values()).items()]
        + [loader_section(lr) for lr in report.loaders.values()]
        + ([host_section(machine)] if machine else []),
    )


def job_section(name: str, findings: list[Finding]) -> str:
    """What was found across the ranks of a job about one loader, first on the page."""
    return section(f"the job: loader '{name}' across its ranks", [finding_box(f, main=n == 0) for n, f in
                   enumerate(findings)], "loader")  # fmt: skip


def host_section(findings: list[Finding]) -> str:
    """The machine's findings (stray workers), once for the whole report."""
    return section("this machine", [finding_box(f, main=False) for f in findings], "loader")


_SEVERITIES = ("critical", "warning", "info")


def loader_section(lr: LoaderReport) -> str:
    rec = lr.recording
    parts = [_verdicts(lr)]
    parts.append("<h3>Measured</h3>" + facts_table(_figures(lr)))
    after = lr.verification.after_recording if lr.verification is not None else None
    peak = max(timeline_peak_ms(rec), timeline_peak_ms(after) if after is not None else 0.0)
    parts.append("<h3>Timeline: your settings</h3>" + timeline(rec, f"timeline of '{lr.name}', your settings", peak))
    if after is not None:
        parts.append(
            "<h3>Timeline: the fix</h3>"
            + timeline(after, f"timeline of '{lr.name}' with {after.settings.describe()}", peak)
        )
    named = [("your settings", rec)] + ([("the fix", after)] if after is not None else [])
    parts.append("<h3>Rate per epoch</h3>" + epoch_rates(named, f"rate per epoch of '{lr.name}'"))
    parts.append("<h3>Workers' memory</h3>" + worker_memory(after or rec, _memory_label(lr.name, rec, after)))
    parts.append("<h3>Host</h3>" + facts_table(_host(rec)))
    if lr.plan is not None:
        parts.append(plan_block(lr.plan))
    return section(f"loader '{lr.name}'", parts, "loader")


def _memory_label(name: str, rec: Recording, after: Recording | None) -> str:
    if after is not None and after.worker_samples:
        return f"workers' memory of '{name}' with the fix ({after.settings.describe()})"
    return f"workers' memory of '{name}' ({rec.settings.describe()})"


def _verdicts(lr: LoaderReport) -> str:
    findings = loader_findings(lr.findings)
    if not findings:
        boxes = [verdict_box("good", "healthy", "No problems found.")]
    else:
        boxes = [finding_box(f, main=(n == 0)) for n, f in enumerate(findings)]
    if lr.verification is not None:
        boxes.insert(1 if findings else 0, _verification(lr))
    if lr.epoch_cost is not None:
        words = lr.epoch_cost.words()
        boxes.append(verdict_box("info", "epoch", words[0].upper() + words[1:] + "."))
    return "".join(boxes)


def finding_box(finding: Finding, main: bool) -> str:
    """A finding as a boxed verdict: rule, title, evidence, fix, and its snippet when it is not a settings change."""
    evidence = ", ".join(f"{key}={short_value(value)}" for key, value in finding.evidence.items())
    snippet = code(finding.snippet) if finding.snippet and not finding.settings_change else ""
    head = f"{finding.rule}: {finding.title}"
    return verdict_box(
        finding.severity,
        ("main finding · " if main else "") + finding.severity,
        head,
        [f"evidence: {evidence}" if evidence else "", f"fix: {finding.fix}"],
        snippet,
    )


def _verification(lr: LoaderReport) -> str:
    v: Verification = lr.verification  # type: ignore[assignment]
    head, change = verification_head(lr.recording.settings, v)
    if v.verdict == "rescued":
        figures = f"{v.before_outcome} → {v.after:.1f} batches/s"
    elif v.verdict in NO_RATE:
        figures = ""
    else:
        speedup = v.speedup
        shown = speedup is not None and not v.unsteady  # an unsteady one is a range, in the note
        figures = f"{v.before:.1f} → {v.after:.1f} batches/s" + (f" ({speedup:.2f}x)" if shown else "")
    lines = [figures, v.note, ceiling_share_words(v) or "", startup_words(v) or ""]
    snippet = code(v.settings.snippet(lr.recording.loader_class)) if v.helped and v.source != "lock-free" else ""
    return verdict_box("good" if v.helped else "warning", head, change, lines, snippet)


def _figures(lr: LoaderReport) -> list[tuple[str, str]]:
    """The console's rows of what was measured, and what the console leaves to the findings: the error, the
    stall and where it was stuck, dead workers, the first samples that failed."""
    rec = lr.recording
    rows = measured_rows(lr)
    if rec.error:
        rows.append(("error", rec.error))
    if rec.stall is not None:
        stall = rec.stall
        rows.append(
            ("stall", f"batch {stall.batch} of epoch {stall.epoch} never came: {stall.reason} ({stall.waited_s:.0f} s)")
        )
        rows.extend(("stuck", where) for stack in stall.stacks if (where := stack.stuck_at()) is not None)
    rows.extend(("worker died", f"epoch {d.epoch}, batch {d.batch}: {d.message}") for d in rec.worker_deaths)
    for error in rec.sample_errors[:5]:
        at = f"dataset index {error.index}" if error.index is not None else f"batch {error.batch}"
        rows.append(("sample error", f"epoch {error.epoch}, {at}: {error.error_type}: {error.message}"))
    return rows


def _host(rec: Recording) -> list[tuple[str, str]]:
    host = rec.host
    shm = "-" if host.shm_free_bytes is None else f"{host.shm_free_bytes / 2**30:.1f} GB free"
    if host.shm_total_bytes:
        shm += f" of {host.shm_total_bytes / 2**30:.1f} GB"
    rows = [
        ("cores", f"{host.usable_cores:g} usable of {host.cpu_count} (affinity {host.affinity_cores})"),
        ("start method", rec.start_method or "-"),
        ("/dev/shm", shm),
        ("sharing", host.sharing_strategy),
        ("accelerator", host.accelerator or "none"),
    ]
    if host.fd_soft_limit is not None:
        rows.append(("open files", f"{host.open_fds} of {host.fd_soft_limit}"))
    if rec.other_processes:
        rows.append(
            (
                "other processes",
                ", ".join(other_process_words(p) for p in rec.other_processes[:3]),
            )
        )
    return rows
