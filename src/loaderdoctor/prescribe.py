"""Prescribe: combine the findings' fixes into one Settings, and verify it by measuring it with the probe."""

from __future__ import annotations

import logging
from collections.abc import Callable

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.probe import ProbeProgress, probe
from loaderdoctor.recording import Recording, batches_per_s
from loaderdoctor.report import Finding, Verification
from loaderdoctor.rules._common import fork_hazards
from loaderdoctor.settings import LoaderSpec, Settings
from loaderdoctor.watchdog import StallPolicy
from loaderdoctor.workload import Step

log = logging.getLogger("loaderdoctor")

# A measured gain under this is within the noise of a short run on a shared machine: not presented as a fix.
MIN_SPEEDUP = 1.10
# Fixes whose point is safety, not speed, must only not cost much speed.
SAFETY_RULES = frozenset({"fork-unsafe", "shm-capacity", "fd-limit"})
MAX_SAFETY_SLOWDOWN = 0.90


def prescribe(recording: Recording, findings: list[Finding]) -> Settings | None:
    """The recorded settings with the changes of every warning and critical finding applied (the main
    diagnosis wins a conflict), or None when they change nothing."""
    changes: dict[str, object] = {}
    for finding in findings:
        if finding.severity == "info":
            continue
        for key, value in finding.settings_change.items():
            changes.setdefault(key, value)
    if not changes:
        return None
    settings = recording.settings.replace(**changes)
    # More workers must not mean forking into the state that makes fork hang.
    if settings.effective_start_method == "fork" and fork_hazards(recording):
        settings = settings.replace(start_method="forkserver", persistent_workers=True)
    return None if settings == recording.settings else settings


def verify(
    spec: LoaderSpec,
    before: Recording,
    findings: list[Finding],
    settings: Settings,
    *,
    budget_s: float,
    epochs: int,
    step: Step | None,
    policy: StallPolicy | None = None,
    progress: Callable[[ProbeProgress], None] | None = None,
) -> Verification:
    """Measure `settings` the way `before` was measured, and judge whether it is a fix worth presenting."""
    before_rate = batches_per_s(before)
    try:
        after = probe(spec, settings, budget_s=budget_s, epochs=epochs, step=step, policy=policy, progress=progress)
    except LoaderDoctorError as error:
        log.info("the prescribed settings could not be measured: %s", error)
        return Verification(settings, before_rate, 0.0, before.outcome, "failed", False, f"not measured: {error}")
    after_rate = batches_per_s(after)
    speedup = after_rate / before_rate if before_rate > 0 else None
    contributors = {f.rule for f in findings if f.severity != "info" and f.settings_change}
    safety_only = contributors <= SAFETY_RULES
    if after.outcome != "completed":
        helped, note = False, f"the prescribed settings {after.outcome} too"
    elif before.outcome != "completed":
        helped = True
        note = f"delivered {len(after.batches)} batches where the original settings {before.outcome}"
    elif speedup is not None and speedup >= MIN_SPEEDUP:
        helped, note = True, f"{speedup:.2f}x faster, measured with the same budget and training step"
    elif safety_only and speedup is not None and speedup >= MAX_SAFETY_SLOWDOWN:
        helped, note = True, f"as fast ({speedup:.2f}x) without the hazard"
    else:
        shown = "unknown" if speedup is None else f"{speedup:.2f}x"
        helped, note = False, f"no measurable gain ({shown}): not a fix for this loader"
    return Verification(settings, before_rate, after_rate, before.outcome, after.outcome, helped, note, after)
