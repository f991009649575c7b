"""The probe: runs a loader with one Settings through the tap for a few epochs and returns its Recording (one
ProbeSession, started, run once, and closed)."""

from __future__ import annotations

import time
from collections.abc import Callable

from loaderdoctor.errors import StoppedByUser, UsageError
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.loader.workload import Step, sleep_step
from loaderdoctor.probe.budget import check_budget, deadline_allowance
from loaderdoctor.probe.measuring import Measuring, ProbeProgress
from loaderdoctor.probe.session import ProbeSession
from loaderdoctor.recording.record import Recording
from loaderdoctor.tap.watchdog import StallPolicy

__all__ = ["ProbeProgress", "ProbeSession", "probe", "probe_with"]


def probe(
    spec: LoaderSpec,
    settings: Settings | None = None,
    *,
    budget_s: float = 30.0,
    epochs: int = 3,
    step: Step | None = None,
    step_ms: float | None = None,
    policy: StallPolicy | None = None,
    progress: Callable[[ProbeProgress], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Recording:
    """Run the loader of `spec` with `settings` (its own by default) for at most `epochs` epochs and about
    `budget_s` seconds of steady running after its start-up (each epoch given an equal share), calling the
    training step after each batch, and return what was measured. The start-up (the first iter() to the
    first batch) comes on top, bounded by the stall policy and about the same budget again."""
    if step is None and step_ms is not None:
        step = sleep_step(step_ms)
    measuring = Measuring(spec, step=step, policy=policy or StallPolicy(), clock=clock, progress=progress)
    return probe_with(measuring, settings, budget_s=budget_s, epochs=epochs)


def probe_with(measuring: Measuring, settings: Settings | None = None, *, budget_s: float, epochs: int) -> Recording:
    """probe(), with what it runs with given as one Measuring: the loader with `settings` (its own by default)
    for at most `epochs` epochs and about `budget_s` seconds of steady running after its start-up."""
    if epochs < 1:
        raise UsageError(f"epochs must be 1 or more, not {epochs}")
    check_budget(budget_s)
    session = ProbeSession(measuring, settings or measuring.spec.settings)
    stopped = False
    try:
        if session.start(startup_limit_s=deadline_allowance(budget_s)):
            session.run(budget_s, epochs=epochs, share_epochs=True)
    except KeyboardInterrupt:
        stopped = True  # Ctrl-C: the workers end below, and what was measured goes up with the interrupt
    finally:
        rec = session.close()
    if stopped:
        raise StoppedByUser(rec)
    return rec
