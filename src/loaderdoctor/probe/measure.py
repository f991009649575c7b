"""The probe: runs a loader with one Settings through the tap for a few epochs and returns its Recording (one
ProbeSession, started, run once, and closed)."""

from __future__ import annotations

import time
from collections.abc import Callable

from loaderdoctor.errors import StoppedByUser, UsageError
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.loader.workload import Step, sleep_step
from loaderdoctor.probe.budget import check_budget, deadline_allowance
from loaderdoctor.probe.session import ProbeProgress, ProbeSession
from loaderdoctor.recording.record import Recording
from loaderdoctor.tap.watchdog import StallPolicy

__all__ = ["ProbeProgress", "ProbeSession", "probe"]


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
    if epochs < 1:
        raise UsageError(f"epochs must be 1 or more, not {epochs}")
    check_budget(budget_s)
    if step is None and step_ms is not None:
        step = sleep_step(step_ms)
    session = ProbeSession(
        spec, settings or spec.settings, step=step, policy=policy or StallPolicy(), progress=progress, clock=clock
    )
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
