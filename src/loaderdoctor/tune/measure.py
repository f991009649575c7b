"""What a trial measures: a probe run of a Settings, and the figures the search compares from its Recording."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.probe import ProbeProgress, probe
from loaderdoctor.recording import (
    Recording,
    batches_per_s,
    loading_cpu_share,
    mean_batch_bytes,
    steady_batches,
)
from loaderdoctor.settings import LoaderSpec, Settings
from loaderdoctor.tune.trial import Measurement
from loaderdoctor.watchdog import StallPolicy
from loaderdoctor.workload import Step

# With a training step, loading keeps up when the step waits for batches at most this share of its own time
# (median within an epoch, and at an epoch's start as a share of the epoch's steps).
KEEPS_UP = 0.10
# A trial runs up to 3 epochs, each given a third of its time at least (an epoch cut short is extrapolated to
# the loader's epoch length): enough to measure the start-up of later epochs twice.
TRIAL_EPOCHS = 3


def _epoch_model(rec: Recording) -> tuple[float, float, int] | None:
    """(start-up of an epoch, steady seconds per batch, batches per epoch) from what the run measured; None
    when it delivered too few batches to tell."""
    epochs = [e for e in rec.epochs if e.batches > 0 and e.first_batch_s is not None]
    steady_batches = sum(e.batches - 1 for e in epochs)
    steady_s = sum(e.wall_s - (e.first_batch_s or 0.0) for e in epochs)
    if steady_batches == 0 or steady_s <= 0:
        return None
    per_batch_s = steady_s / steady_batches
    later = [e.first_batch_s or 0.0 for e in epochs[1:]]
    if later:
        startup_s = statistics.median(later)
    elif rec.settings.persistent_workers:
        startup_s = per_batch_s
    else:
        startup_s = epochs[0].first_batch_s or 0.0
    return startup_s, per_batch_s, rec.batches_per_epoch or max(e.batches for e in epochs)


def epoch_rate(rec: Recording) -> float:
    """Batches per second over a whole epoch of the training loop, from what the run measured.

    An epoch costs its start-up (iter() to the first batch) plus its other batches at the steady pace. The
    start-up is the one measured in later epochs when the run had them; with one epoch only, it is that
    epoch's for workers started anew each epoch, and one batch's time for persistent workers (their first
    epoch's start-up is paid once per training run, not per epoch). A run shorter than an epoch is
    extrapolated to the loader's epoch length the same way.
    """
    model = _epoch_model(rec)
    if model is None:
        return batches_per_s(rec)
    startup_s, per_batch_s, per_epoch = model
    return per_epoch / (startup_s + (per_epoch - 1) * per_batch_s)


def keeps_up(rec: Recording) -> bool | None:
    """Whether loading kept up with the training step: the step hardly waited for a batch, neither within an
    epoch (median wait) nor at its start; None without a step."""
    model = _epoch_model(rec)
    if rec.step_s is None or rec.step_s <= 0 or model is None:
        return None
    waits = [b.wait_s for b in steady_batches(rec)]
    startup_s, _, per_epoch = model
    steady_wait_s = statistics.median(waits) if waits else startup_s
    return steady_wait_s <= KEEPS_UP * rec.step_s and startup_s <= KEEPS_UP * rec.step_s * per_epoch


def loading_memory_bytes(rec: Recording) -> int | None:
    """The most memory loading held at once: its worker processes' USS together, at the busiest sampling,
    plus its batches in flight; None without workers (loading then shares the main process's memory)."""
    if rec.settings.num_workers == 0:
        return None
    batch_bytes = mean_batch_bytes(rec) or 0
    in_flight = int(rec.settings.batches_in_flight * batch_bytes)
    by_time: dict[float, int] = {}
    for sample in rec.worker_samples:
        by_time[sample.t_s] = by_time.get(sample.t_s, 0) + sample.uss_bytes
    return max(by_time.values(), default=0) + in_flight


def measurement(rec: Recording) -> Measurement:
    """The figures of one trial's run."""
    error = rec.error
    outcome = rec.outcome
    if rec.stall is not None and not rec.stall.hung:
        # No batch before the trial's time ran out, from workers that were busy: slow, not stuck.
        outcome, error = "completed", f"no batch within the trial's {rec.budget_s:.1f} s"
    rate = epoch_rate(rec) if outcome == "completed" else 0.0
    exhausted = [e.batches for e in rec.epochs if e.ended == "exhausted"]
    return Measurement(
        batches_per_s=rate,
        outcome=outcome,
        seconds=rec.wall_s,
        memory_bytes=loading_memory_bytes(rec),
        cpu_share=loading_cpu_share(rec),
        keeps_up=keeps_up(rec) if outcome == "completed" else None,
        error=error,
        epoch_batches=max(exhausted) if exhausted else None,
    )


def probe_measure(
    spec: LoaderSpec,
    *,
    step: Step | None,
    policy: StallPolicy | None = None,
    progress: Callable[[Settings, ProbeProgress], None] | None = None,
    recordings: list[Recording] | None = None,
) -> Callable[[Settings, float], Measurement]:
    """A measure function for the search: probe `spec` with the given settings for the given seconds, the
    training step after each batch; each Recording is appended to `recordings` when given, and `progress`
    hears of each run's figures with its settings."""

    def measure(settings: Settings, seconds: float) -> Measurement:
        on_probe = None if progress is None else (lambda figures: progress(settings, figures))
        try:
            rec = probe(
                spec,
                settings,
                budget_s=seconds,
                epochs=TRIAL_EPOCHS,
                step=step,
                policy=policy,
                progress=on_probe,
            )
        except LoaderDoctorError as error:  # settings this loader cannot run with (an unpicklable dataset...)
            return Measurement(0.0, "crashed", 0.0, error=error.message)
        if recordings is not None:
            recordings.append(rec)
        return measurement(rec)

    return measure
