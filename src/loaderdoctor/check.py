"""check(): measure each loader of a target, diagnose it, and verify the prescribed fix by measuring it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor import target as targets
from loaderdoctor.errors import UsageError
from loaderdoctor.prescribe import prescribe, verify
from loaderdoctor.probe import ProbeProgress, Step, probe, sleep_step
from loaderdoctor.report import LoaderReport, Report
from loaderdoctor.rules import diagnose
from loaderdoctor.settings import LoaderSpec
from loaderdoctor.watchdog import StallPolicy
from loaderdoctor.workload import Workload

# progress(loader name, phase: "measure" | "verify", figures so far)
CheckProgress = Callable[[str, str, ProbeProgress], None]
DEFAULT_BUDGET_S = 60.0
DEFAULT_EPOCHS = 3


def _as_resolved(target_or_loader: Any) -> targets.ResolvedTarget:
    if isinstance(target_or_loader, str):
        return targets.resolve(target_or_loader)
    if isinstance(target_or_loader, Workload):
        return targets.ResolvedTarget("<Workload>", target_or_loader, target_or_loader.loaders())
    if isinstance(target_or_loader, DataLoader):
        return targets.ResolvedTarget("<DataLoader>", Workload(train=target_or_loader), {"loader": target_or_loader})
    if isinstance(target_or_loader, Mapping) and target_or_loader:
        loaders = dict(target_or_loader)
        for name, loader in loaders.items():
            if not isinstance(loader, DataLoader):
                raise UsageError(f"loader {name!r} is a {type(loader).__name__}, not a DataLoader")
        return targets.ResolvedTarget("<loaders>", Workload(train=next(iter(loaders.values()))), loaders)
    raise UsageError(
        f"check() takes a TARGET string, a DataLoader, a dict of DataLoaders or a Workload, "
        f"not {type(target_or_loader).__name__}"
    )


def _step_of(workload: Workload, step_ms: float | None) -> Step | None:
    if step_ms is not None:
        if not (math.isfinite(step_ms) and step_ms >= 0):
            raise UsageError(f"the step must be 0 ms or more, not {step_ms}")
        return sleep_step(step_ms)
    if workload.step is not None:
        return workload.step
    return None if workload.step_ms is None else sleep_step(workload.step_ms)


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
    resolved = _as_resolved(target_or_loader)
    try:
        step = _step_of(resolved.workload, step_ms)
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
            if verify_fix:
                probes_left -= 1
            reports[name] = LoaderReport(name, recording, findings, verification)
        return Report(resolved.target, reports)
    finally:
        resolved.close()


def _phase_progress(
    progress: CheckProgress | None, name: str
) -> Callable[[str], Callable[[ProbeProgress], None] | None]:
    """For a loader: a function giving, per phase, the probe's progress callback (None without a display)."""

    def for_phase(phase: str) -> Callable[[ProbeProgress], None] | None:
        if progress is None:
            return None
        return lambda figures: progress(name, phase, figures)

    return for_phase
