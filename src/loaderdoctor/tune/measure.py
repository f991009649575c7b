"""What a trial measures: a probe run of a Settings, and the figures the search compares from its Recording."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.loader.settings import Settings
from loaderdoctor.probe.measure import probe_with
from loaderdoctor.probe.measuring import Measuring, ProbeProgress
from loaderdoctor.recording.limit import host_limit
from loaderdoctor.recording.rates import epoch_batches, epoch_overhead_s, first_startup_s, training_rate
from loaderdoctor.recording.record import Recording, mean_batch_bytes, steady_batches
from loaderdoctor.recording.usage import loading_cpu
from loaderdoctor.tune.trial import Measurement

# With a training step, loading keeps up when the step waits for batches at most this share of its own time
# (median within an epoch, and at an epoch's start as a share of the epoch's steps).
KEEPS_UP = 0.10
# A trial runs up to 3 epochs, each given a third of its time at least (an epoch cut short is extrapolated to
# the loader's epoch length): enough to measure the start-up of later epochs twice.
TRIAL_EPOCHS = 3


def keeps_up(rec: Recording) -> bool | None:
    """Whether loading kept up with the training step: the step hardly waited for a batch, neither within an
    epoch (median wait) nor at its start (the epoch's overhead against its steps); None without a step."""
    waits = [b.wait_s for b in steady_batches(rec)]
    if rec.step_s is None or rec.step_s <= 0 or not waits:
        return None
    per_epoch = epoch_batches(rec) or len(rec.batches)
    overhead_ok = epoch_overhead_s(rec) <= KEEPS_UP * rec.step_s * per_epoch
    return statistics.median(waits) <= KEEPS_UP * rec.step_s and overhead_ok


def loading_memory_bytes(rec: Recording) -> int | None:
    """The most memory loading held at once: its worker processes' USS together, at the busiest sampling,
    plus its batches in flight; None without workers (loading then shares the main process's memory), or when
    no sampling read their USS."""
    if rec.settings.num_workers == 0:
        return None
    batch_bytes = mean_batch_bytes(rec) or 0
    in_flight = int(rec.settings.batches_in_flight * batch_bytes)
    by_time: dict[float, int] = {}
    for sample in rec.worker_samples:
        if sample.uss_bytes is not None:
            by_time[sample.t_s] = by_time.get(sample.t_s, 0) + sample.uss_bytes
    return max(by_time.values()) + in_flight if by_time else None


def measurement(rec: Recording) -> Measurement:
    """The figures of one trial's run."""
    error = rec.error
    outcome = rec.outcome
    if rec.stall is not None and not rec.stall.hung:
        # No batch before the trial's time ran out, from workers that were busy: slow, not stuck.
        outcome, error = "completed", f"no batch within the trial's {rec.budget_s:.1f} s"
    rate = (training_rate(rec) or 0.0) if outcome == "completed" else 0.0
    if outcome == "completed" and rate == 0.0 and error is None:
        error = "too few batches after its start-up to measure a rate"
    exhausted = [e.batches for e in rec.epochs if e.ended == "exhausted"]
    cpu = loading_cpu(rec)
    limit = host_limit(rec) if outcome == "completed" else None
    return Measurement(
        batches_per_s=rate,
        outcome=outcome,
        seconds=rec.wall_s,
        memory_bytes=loading_memory_bytes(rec),
        loading_cores=None if cpu is None else cpu.cores,
        ready_cores=None if cpu is None else cpu.run_delay_cores,
        keeps_up=keeps_up(rec) if outcome == "completed" else None,
        error=error,
        epoch_batches=max(exhausted) if exhausted else None,
        copies=max((e.typical_copies for e in rec.epochs if e.typical_copies), default=None),
        startup_s=first_startup_s(rec),
        limit_batches_per_s=None if limit is None else limit.batches_per_s,
        limit_binds=None if limit is None else limit.binds,
    )


def probe_measure(
    measuring: Measuring,
    *,
    progress: Callable[[Settings, ProbeProgress], None] | None = None,
    recordings: list[Recording] | None = None,
) -> Callable[[Settings, float], Measurement]:
    """A measure function for the search: probe as `measuring` says with the given settings for the given
    seconds; each Recording is appended to `recordings` when given. Each run's figures go to `progress` with its
    settings when given, else to the measuring's own progress."""

    def measure(settings: Settings, seconds: float) -> Measurement:
        trial = measuring
        if progress is not None:
            trial = measuring.with_progress(lambda figures: progress(settings, figures))
        try:
            rec = probe_with(trial, settings, budget_s=seconds, epochs=TRIAL_EPOCHS)
        except LoaderDoctorError as error:  # settings this loader cannot run with (an unpicklable dataset...)
            return Measurement(0.0, "crashed", 0.0, error=error.message)
        if recordings is not None:
            recordings.append(rec)
        return measurement(rec)

    return measure
