"""check(): measure each loader of a target, diagnose it, and verify the prescribed fix by measuring it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from loaderdoctor import target as targets
from loaderdoctor.errors import UsageError
from loaderdoctor.prescribe import prescribe, verify
from loaderdoctor.probe import ProbeProgress, probe
from loaderdoctor.recording import Recording
from loaderdoctor.report import Finding, LoaderReport, Report, Verification
from loaderdoctor.rules import diagnose
from loaderdoctor.settings import LoaderSpec, Settings
from loaderdoctor.tune.run import MIN_TRIAL_S, default_memory_budget, tune_loader
from loaderdoctor.watchdog import StallPolicy
from loaderdoctor.workload import Step

# progress(loader name, phase: "measure" | "verify", figures so far)
CheckProgress = Callable[[str, str, ProbeProgress], None]
DEFAULT_BUDGET_S = 60.0
DEFAULT_EPOCHS = 3
# When the rules' fix is about speed, a quick measured search (the tuner's quick mode) gets this many budget
# shares, at most MAX_SEARCH_S; its choice replaces the rules' fix when measured SEARCH_MARGIN faster.
_SEARCH_SHARES = 2
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
) -> Report:
    """Measure every loader of `target_or_loader` within about `budget_s` seconds in all, name what is wrong,
    and measure the prescribed settings too (unless verify_fix is False)."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise UsageError(f"the budget must be more than 0 seconds, not {budget_s}")
    resolved = targets.resolve_any(target_or_loader, "check")
    try:
        step = resolved.workload.training_step(step_ms)
        deadline = time.monotonic() + budget_s
        probes_left = len(resolved.loaders) * (2 if verify_fix else 1)

        def budget_share() -> float:
            """What is left of the budget, shared by the probes still to run (each one's share grows when an
            earlier one needed less)."""
            return max(1.0, (deadline - time.monotonic()) / max(probes_left, 1))

        reports: dict[str, LoaderReport] = {}
        for name, loader in resolved.loaders.items():
            spec = LoaderSpec.from_loader(loader)
            phase_progress = _phase_progress(progress, name)
            measure = phase_progress("measure")
            recording = probe(spec, budget_s=budget_share(), epochs=epochs, step=step, policy=policy, progress=measure)
            probes_left -= 1
            findings = diagnose(recording)
            fixed = prescribe(recording, findings) if verify_fix else None
            verification = None
            if fixed is not None:
                searched = _worth_a_search(recording, fixed)
                if searched:
                    probes_left += _SEARCH_SHARES + 1  # the search, and the measuring of what it finds
                verification = verify(
                    spec,
                    recording,
                    findings,
                    fixed,
                    budget_s=budget_share(),
                    epochs=epochs,
                    step=step,
                    policy=policy,
                    progress=phase_progress("verify"),
                )
                if searched:
                    probes_left -= 1
                    verification = _searched_fix(
                        spec,
                        recording,
                        findings,
                        verification,
                        search_s=min(MAX_SEARCH_S, budget_share() * _SEARCH_SHARES),
                        verify_s=budget_share,
                        epochs=epochs,
                        step=step,
                        policy=policy,
                        progress=progress,
                        name=name,
                    )
                    probes_left -= _SEARCH_SHARES
            if verify_fix:
                probes_left -= 1
            reports[name] = LoaderReport(name, recording, findings, verification)
        return Report(resolved.target, reports)
    finally:
        resolved.close()


def _worth_a_search(recording: Recording, fixed: Settings) -> bool:
    """Whether the rules' fix is about speed (workers, prefetch, persistence) for a loader that ran: then a
    quick measured search may find better settings than the rules' one-shot estimate."""
    if recording.outcome != "completed":
        return False
    before = recording.settings
    return any(getattr(fixed, knob) != getattr(before, knob) for knob in _SPEED_KNOBS)


def _searched_fix(
    spec: LoaderSpec,
    recording: Recording,
    findings: list[Finding],
    rules_fix: Verification,
    *,
    search_s: float,
    verify_s: Callable[[], float],
    epochs: int,
    step: Step | None,
    policy: StallPolicy | None,
    progress: CheckProgress | None,
    name: str,
) -> Verification:
    """The tuner's quick search, its choice measured the way the rules' fix was: the faster of the two, the
    searched one only when it beats the rules' fix by SEARCH_MARGIN."""
    if search_s < 3 * MIN_TRIAL_S:
        return rules_fix
    tune_progress = None if progress is None else (lambda _name, _what, figures: progress(name, "tune", figures))
    tuning = tune_loader(
        name,
        spec,
        budget_s=search_s,
        memory_bytes=default_memory_budget(),
        step=step,
        quick=True,
        policy=policy,
        progress=tune_progress,
    )
    found = tuning.settings
    if found.backend == "process" and found.num_workers:
        found = found.replace(worker_threads=rules_fix.settings.worker_threads)  # the rules' thread limit stays
    if not tuning.found or found in (rules_fix.settings, recording.settings):
        return rules_fix
    searched = verify(
        spec,
        recording,
        findings,
        found,
        budget_s=verify_s(),
        epochs=epochs,
        step=step,
        policy=policy,
        progress=None if progress is None else (lambda figures: progress(name, "verify", figures)),
    )
    if searched.helped and searched.after >= rules_fix.after * SEARCH_MARGIN:
        versus = f", {searched.after / rules_fix.after:.2f}x the rules' fix" if rules_fix.after > 0 else ""
        searched.note += f"; found by a quick measured search of {len(tuning.trials)} trials{versus}"
        searched.source = "tune"
        return searched
    return rules_fix


def _phase_progress(
    progress: CheckProgress | None, name: str
) -> Callable[[str], Callable[[ProbeProgress], None] | None]:
    """For a loader: a function giving, per phase, the probe's progress callback (None without a display)."""

    def for_phase(phase: str) -> Callable[[ProbeProgress], None] | None:
        if progress is None:
            return None
        return lambda figures: progress(name, phase, figures)

    return for_phase
