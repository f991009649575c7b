"""What a trial's run counts as: the training loop's rate, loading's memory, a slow start versus a stall, keeping up."""

from __future__ import annotations

import pytest
from recordings import BATCH_BYTES, MIB, make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.rates import training_rate
from loaderdoctor.recording.record import Stall
from loaderdoctor.tune.measure import loading_memory_bytes, measurement

WORKERS = Settings(num_workers=2, prefetch_factor=2, persistent_workers=False)


def test_a_trials_rate_is_the_training_loops_and_its_start_up_is_apart():
    rec = make_recording(settings=WORKERS, step_s=None, epochs=3, wait_s=0.01, first_batch_s=[3.0, 1.0, 1.0])
    measured = measurement(rec)
    assert measured.batches_per_s == pytest.approx(training_rate(rec))
    assert measured.startup_s == 3.0


def test_a_trial_with_no_batch_after_its_start_up_has_no_rate_and_says_why():
    rec = make_recording(settings=WORKERS, step_s=None, epochs=1, batches_per_epoch=1, first_batch_s=5.0)
    measured = measurement(rec)
    assert measured.batches_per_s == 0.0
    assert "too few batches after its start-up" in measured.error


def test_the_copies_of_a_sample_are_carried_to_the_search():
    rec = make_recording(settings=WORKERS)
    for epoch in rec.epochs:
        epoch.typical_copies = 2
    assert measurement(rec).copies == 2
    assert measurement(make_recording(settings=WORKERS)).copies is None


def test_loading_memory_is_the_workers_uss_together_plus_the_batches_in_flight():
    persistent = Settings(num_workers=2, prefetch_factor=2, persistent_workers=True)
    rec = make_recording(settings=persistent, uss_mb_at=lambda t: 150.0)
    assert loading_memory_bytes(rec) == 2 * 150 * MIB + 2 * 2 * BATCH_BYTES
    assert loading_memory_bytes(make_recording(settings=Settings())) is None


def test_keeping_up_with_the_step_means_the_loop_runs_at_the_steps_pace():
    quick = make_recording(settings=WORKERS, step_s=0.05, wait_s=0.0005, first_batch_s=0.001)
    slow = make_recording(settings=WORKERS, step_s=0.05, wait_s=0.05, first_batch_s=0.05)
    assert measurement(quick).keeps_up is True
    assert measurement(slow).keeps_up is False
    assert measurement(make_recording(settings=WORKERS, step_s=None)).keeps_up is None


def _stall(*, over_budget: bool, idle: bool) -> Stall:
    return Stall(
        epoch=0,
        batch=0,
        waited_s=2.0,
        threshold_s=2.0,
        reason="no batch",
        workers_cpu_idle=idle,
        over_budget=over_budget,
    )


def test_no_batch_from_busy_workers_before_the_trial_ends_is_slow_not_stalled():
    rec = make_recording(settings=WORKERS, outcome="stalled", stall=_stall(over_budget=True, idle=False))
    measured = measurement(rec)
    assert measured.outcome == "completed" and "no batch within" in measured.error


def test_a_hang_is_a_stalled_trial_with_no_rate():
    rec = make_recording(settings=WORKERS, outcome="stalled", stall=_stall(over_budget=False, idle=True))
    measured = measurement(rec)
    assert measured.outcome == "stalled" and measured.batches_per_s == 0.0


def test_loading_memory_is_unknown_where_no_round_read_the_workers_uss():
    persistent = Settings(num_workers=2, prefetch_factor=2, persistent_workers=True)
    rec = make_recording(settings=persistent, uss_mb_at=lambda t: 150.0)
    for sample in rec.worker_samples:
        sample.uss_bytes = None  # every round at a window's edge: the CPU only
    assert loading_memory_bytes(rec) is None  # not the batches in flight alone, as if the workers held nothing
