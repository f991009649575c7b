"""check(): measure each loader of a target, diagnose it, and verify the prescribed fix by measuring it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from loaderdoctor.errors import StoppedByUser, UsageError
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.plain.words import plural
from loaderdoctor.probe.budget import check_budget, target_limit_s
from loaderdoctor.probe.measure import probe_with
from loaderdoctor.probe.measuring import Measuring, ProbeProgress
from loaderdoctor.probe.userstate import user_state_kept
from loaderdoctor.probe.verify import verify
from loaderdoctor.recording.epochcost import epoch_cost
from loaderdoctor.recording.record import Recording
from loaderdoctor.report import Finding, LoaderReport, Report, Verification
from loaderdoctor.rules import ESTIMATED_CAUSES, diagnose, order
from loaderdoctor.rules.data import duplicate_samples
from loaderdoctor.rules.locks import lock_free_provable
from loaderdoctor.rules.prescribe import prescribe
from loaderdoctor.tap.watchdog import StallPolicy
from loaderdoctor.targets import resolve as targets
from loaderdoctor.tune.measure import measurement
from loaderdoctor.tune.run import MIN_TRIAL_S, default_memory_budget, tune_loader

# progress(loader name, phase: "measure" | "tune" | "verify", figures so far)
CheckProgress = Callable[[str, str, ProbeProgress], None]
DEFAULT_BUDGET_S = 60.0
DEFAULT_EPOCHS = 3
# Of each loader's budget: this share measures it; the rest verifies the fix in turns with the original
# settings, after a quick measured search (the tuner's quick mode) when the fix is about speed and at least
# MIN_SEARCH_BUDGET_S are left after measuring (the default budget leaves that; a smaller one leaves all of it
# to the verification's windows): SEARCH_SHARE of it, at most MAX_SEARCH_S. The searched settings replace the
# rules' fix only when measured SEARCH_MARGIN faster.
MEASURE_SHARE = 0.25
SEARCH_SHARE = 0.3
MIN_SEARCH_BUDGET_S = 40.0
MAX_SEARCH_S = 20.0
SEARCH_MARGIN = 1.05
_SPEED_KNOBS = ("num_workers", "prefetch_factor", "persistent_workers")


def check(
    target_or_loader: Any,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    epochs: int = DEFAULT_EPOCHS,
    step_ms: float | None = None,
    verify_fix: bool = True,
    policy: StallPolicy | None = None,
    progress: CheckProgress | None = None,
    epoch_batches: int | None = None,
    cost_per_hour: float | None = None,
) -> Report:
    """Measure every loader of `target_or_loader` within about `budget_s` seconds in all (workers' start-up
    comes on top), name what is wrong, and measure the prescribed settings against the original ones too
    (unless verify_fix is False). Each loader's report says what an epoch of `epoch_batches` (default: the
    loader's length) takes now and with the fix, and with `cost_per_hour` what it costs. The loaders are left
    as they were found: their generators and the global random states are restored afterwards (see
    user_state_kept)."""
    check_budget(budget_s, step_ms)
    if epoch_batches is not None and (isinstance(epoch_batches, bool) or not isinstance(epoch_batches, int)
                                      or epoch_batches < 1):  # fmt: skip
        raise UsageError(f"epoch_batches must be a whole number, 1 or more, not {epoch_batches!r}")
    if cost_per_hour is not None and (not isinstance(cost_per_hour, (int, float)) or cost_per_hour < 0):
        raise UsageError(f"cost_per_hour must be a number, 0 or more, not {cost_per_hour!r}")
    resolved = targets.resolve_any(target_or_loader, "check", target_limit_s(budget_s))
    try:
        with user_state_kept(resolved.loaders.values()):
            step = resolved.workload.training_step(step_ms)
            policy = policy or StallPolicy()
            deadline = time.monotonic() + budget_s
            reports: dict[str, LoaderReport] = {}
            names = list(resolved.loaders)
            for number, name in enumerate(names):
                loader_budget = max(1.0, (deadline - time.monotonic()) / (len(names) - number))
                measuring = Measuring(LoaderSpec.from_loader(resolved.loaders[name]), step=step, policy=policy)
                try:
                    reports[name] = _check_loader(
                        name, measuring, budget_s=loader_budget, epochs=epochs, verify_fix=verify_fix, progress=progress
                    )
                    reports[name].epoch_cost = epoch_cost(reports[name], epoch_batches, cost_per_hour)
                except KeyboardInterrupt as stop:
                    partial = _partial_report(name, stop)
                    if partial is not None:
                        reports[name] = partial
                    raise StoppedByUser(Report(resolved.target, reports)) from None
            return Report(resolved.target, reports)
    finally:
        resolved.close()


def _check_loader(
    name: str,
    measuring: Measuring,
    *,
    budget_s: float,
    epochs: int,
    verify_fix: bool,
    progress: CheckProgress | None,
) -> LoaderReport:
    """One loader: measure, diagnose, prescribe, search when worth it, and verify in turns; each phase's figures
    go to `progress` with the loader's name and the phase."""
    deadline = time.monotonic() + budget_s
    phase = _phase_progress(progress, name)
    measure_s = budget_s * (MEASURE_SHARE if verify_fix else 1.0)
    recording = probe_with(measuring.with_progress(phase("measure")), budget_s=measure_s, epochs=epochs)
    findings = diagnose(recording)
    try:
        return _fix_and_verify(name, measuring, recording, findings, deadline, verify_fix, progress)
    except KeyboardInterrupt:
        raise StoppedByUser(LoaderReport(name, recording, findings, None)) from None  # measured; no fix verified


def _fix_and_verify(
    name: str,
    measuring: Measuring,
    recording: Recording,
    findings: list[Finding],
    deadline: float,
    verify_fix: bool,
    progress: CheckProgress | None,
) -> LoaderReport:
    """After the measurement: prescribe, search when worth it, and verify in turns; or, when the main
    diagnosis is a lock the workers take on read-only files, measure the loader without it."""
    phase = _phase_progress(progress, name)
    if (
        verify_fix
        and findings
        and findings[0].rule == "lock-contention"
        and lock_free_provable(recording.worker_activity)
    ):
        (without_lock,) = verify(
            measuring.with_progress(phase("verify")),
            recording,
            findings,
            [recording.settings],
            budget_s=max(1.0, deadline - time.monotonic()),
            lock_free=True,
        )
        return LoaderReport(name, recording, findings, _proved_without_lock(without_lock))
    fixed = prescribe(recording, findings) if verify_fix else None
    if fixed is None:
        return LoaderReport(name, recording, findings, None)
    candidates = [fixed]
    left = deadline - time.monotonic()
    searched_trials = 0
    if _worth_a_search(recording, fixed) and left >= MIN_SEARCH_BUDGET_S:
        found, searched_trials = _search(
            name, measuring.with_progress(phase("tune")), recording, search_s=min(MAX_SEARCH_S, left * SEARCH_SHARE)
        )
        if found is not None and found not in (fixed, recording.settings):
            candidates.append(found)
    verifications = verify(
        measuring.with_progress(phase("verify")),
        recording,
        findings,
        candidates,
        budget_s=max(1.0, deadline - time.monotonic()),
    )
    verification = _chosen(verifications, searched_trials)
    findings = _with_measured_advice(_with_data_findings(findings, verification), recording, verification)
    return LoaderReport(name, recording, findings, verification)


def _partial_report(name: str, stop: KeyboardInterrupt) -> LoaderReport | None:
    """What a Ctrl-C left of one loader's check: its report without a verified fix, or the findings of the
    batches measured before it; None when nothing was."""
    partial = getattr(stop, "partial", None)
    if isinstance(partial, LoaderReport):
        return partial
    if isinstance(partial, Recording) and partial.batches:
        return LoaderReport(name, partial, diagnose(partial), None)
    return None


def _worth_a_search(recording: Recording, fixed: Settings) -> bool:
    """Whether the rules' fix is about speed (workers, prefetch, persistence) for a loader that ran: then a
    quick measured search may find better settings than the rules' one-shot estimate."""
    if recording.outcome != "completed":
        return False
    before = recording.settings
    return any(getattr(fixed, knob) != getattr(before, knob) for knob in _SPEED_KNOBS)


def _search(name: str, measuring: Measuring, recording: Recording, *, search_s: float) -> tuple[Settings | None, int]:
    """The settings the tuner's quick search chose (None when it found nothing better than the baseline), and
    how many trials it made; each trial's figures go to the measuring's progress. The check's own measurement
    is its baseline."""
    if search_s < 3 * MIN_TRIAL_S:
        return None, 0
    tuning = tune_loader(
        name,
        measuring,
        budget_s=search_s,
        memory_bytes=default_memory_budget(),
        quick=True,
        baseline=(recording, measurement(recording)),
    )
    if not tuning.found or tuning.chosen is tuning.baseline:
        return None, len(tuning.trials)
    return tuning.settings, len(tuning.trials)


def _chosen(verifications: list[Verification], searched_trials: int) -> Verification:
    """The rules' fix (the first), unless the searched one (the second) helps and is SEARCH_MARGIN faster."""
    rules_fix = verifications[0]
    if len(verifications) < 2:
        return rules_fix
    searched = verifications[1]
    beats = searched.helped and (not rules_fix.helped or searched.after >= rules_fix.after * SEARCH_MARGIN)
    if not beats:
        return rules_fix
    versus = f", {searched.after / rules_fix.after:.2f}x the rules' fix" if rules_fix.after > 0 else ""
    searched.note += f"; found by a quick measured search of {searched_trials} trials{versus}"
    searched.source = "tune"
    return searched


def _proved_without_lock(verification: Verification) -> Verification:
    """The lock-free measurement worded as the proof of the lock's cost: "without the lock on read-only
    files: 1.90x faster (...)", with the lock calls made no-ops in its workers."""
    verification.source = "lock-free"
    speedup = verification.speedup
    if verification.verdict == "no-gain" and speedup is not None and verification.spread is not None:
        low, high = verification.spread
        verification.note = (
            f"no measurable gain ({speedup:.2f}x; {verification.pairs} pairs of windows, {low:.2f}x to "
            f"{high:.2f}x): the lock is not what holds the workers back"
        )
    note = f"without the lock on read-only files: {verification.note}"
    after = verification.after_recording
    activity = None if after is None else after.worker_activity
    if activity is not None:
        note += f"; {plural(activity.lock_calls.made_free, 'lock call')} made no-ops, in the workers only"
    verification.note = note
    return verification


def _with_data_findings(findings: list[Finding], verification: Verification) -> list[Finding]:
    """The findings, with duplicate-samples added when the fix's run showed workers repeating the stream."""
    after = verification.after_recording
    if verification.verdict != "other-data" or after is None or any(f.rule == "duplicate-samples" for f in findings):
        return findings
    finding = duplicate_samples(after)
    return findings if finding is None else order([*findings, finding])


# Verdicts that measured the fix's settings as no fix: neither faster nor a quicker start on this machine.
_DISPROVED = frozenset({"no-gain", "slower"})


def _with_measured_advice(findings: list[Finding], recording: Recording, verification: Verification) -> list[Finding]:
    """The findings, with the fix of each whose change of settings was measured and found no fix said so in its
    own words instead of left as advice (its snippet and change dropped): one report tells one story. A cause
    whose cost was only estimated from the waits (ESTIMATED_CAUSES) falls to info then: measured, it explains
    none of them, and the finding the waits show leads."""
    if verification.verdict not in _DISPROVED or verification.source != "rules":
        return findings
    tried = verification.settings
    speedup = verification.speedup
    measured = f"{speedup:.2f}x" if speedup is not None else "no faster"
    amended = []
    for finding in findings:
        change = finding.settings_change
        applies = change and recording.settings.replace(**change) != recording.settings
        if applies and all(getattr(tried, key, None) == value for key, value in change.items()):
            words = ", ".join(f"{key}={value!r}" for key, value in change.items())
            estimated = finding.rule in ESTIMATED_CAUSES
            finding = dataclasses.replace(
                finding,
                severity="info" if estimated else finding.severity,
                impact=0.0 if estimated else finding.impact,
                fix=(
                    f"Measured here in turns with the loader's own settings, {words} was not a fix "
                    f"({measured}, {verification.verdict.replace('-', ' ')}): the evidence above stands, but this "
                    "change does not pay on this machine as it is now. " + finding.fix
                ),
                snippet=None,
                settings_change={},
            )
        amended.append(finding)
    return order(amended)


def _phase_progress(
    progress: CheckProgress | None, name: str
) -> Callable[[str], Callable[[ProbeProgress], None] | None]:
    """For a loader: a function giving, per phase, the probe's progress callback (None without a display)."""

    def for_phase(phase: str) -> Callable[[ProbeProgress], None] | None:
        if progress is None:
            return None
        return lambda figures: progress(name, phase, figures)

    return for_phase
