"""The host's limit from hand-made Recordings: CPU-bound, I/O-bound, step-bound, and unknown."""

from __future__ import annotations

import dataclasses

import pytest
from recordings import make_recording
from rich.console import Console

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.limit import MAX_IO_WORKERS, host_limit, limit_words, share_of_limit
from loaderdoctor.recording.rates import training_rate
from loaderdoctor.recording.usage import worker_cpu_per_batch
from loaderdoctor.render.tune import render
from loaderdoctor.report import LoaderReport, Verification
from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.trial import Measurement, Trial

MAIN_PROCESS = Settings(num_workers=0)


def test_loading_that_computes_in_the_main_process_is_bound_by_the_cores():
    # 50 ms of CPU per batch in next(), a 20 ms step: two cores could load 40 batches/s, the step allows 50.
    rec = make_recording(settings=MAIN_PROCESS, wait_s=0.05, wait_cpu_share=1.0, step_s=0.02)
    limit = host_limit(rec)
    assert limit.binds == "loading-cpu"
    assert limit.steady_batches_per_s == pytest.approx(2 / 0.05)
    # Each epoch of 20 batches pays its first batch whole (one loader's 50 ms, where steady batches come 25 ms
    # apart) and its last 20 ms step with nothing loading beside it.
    assert limit.epoch_batches == 20 and limit.epoch_boundary_s == pytest.approx(0.05 - 0.025 + 0.02)
    assert limit.batches_per_s == pytest.approx(20 / (20 / 40 + 0.045))
    assert limit.cpu_s_per_batch == pytest.approx(0.05)
    assert limit.step_batches_per_s == pytest.approx(50.0)
    assert limit.loading_io_batches_per_s is None  # no wait beyond the CPU
    share = share_of_limit(training_rate(rec), limit)
    assert share == pytest.approx((1 / 0.07) / limit.batches_per_s, rel=0.05)
    words = limit_words(limit, training_rate(rec), fixed_rate=34.9)
    assert words.startswith(f"{share:.0%} of this host's limit of 36.7 batches/s: loading's CPU binds (50 ms")
    assert "40.0 within an epoch, less each epoch's end (45 ms over 20 batches)" in words
    assert words.endswith("the fix reaches 95%")


def test_loading_that_waits_on_io_is_bound_by_the_workers_that_could_overlap_it():
    # 5 ms of CPU and 45 ms of waiting per batch, a 1 ms step: 16 workers could overlap 320 batches/s.
    rec = make_recording(settings=MAIN_PROCESS, wait_s=0.05, wait_cpu_share=0.1, step_s=0.001)
    limit = host_limit(rec)
    assert limit.io_s_per_batch == pytest.approx(0.045)
    assert limit.binds == "loading-io"
    assert limit.steady_batches_per_s == pytest.approx(MAX_IO_WORKERS / 0.05)
    # Each epoch: its first batch whole (50 ms, where steady batches come 1/320 s apart) and its last 1 ms step.
    assert limit.batches_per_s == pytest.approx(20 / (20 / 320 + 0.05 - 1 / 320 + 0.001))
    assert limit.loading_cpu_batches_per_s == pytest.approx(2 / 0.005)


def test_workers_that_keep_up_leave_the_step_binding():
    # Two workers at 0.2 of a core each keep up with a 50 ms step: their waits cannot be seen, the step binds.
    # The workers start in 0.5 s once; the second epoch's first batch, from the running workers, takes 0.12 s.
    persistent = Settings(num_workers=2, persistent_workers=True)
    rec = make_recording(settings=persistent, cpu_share=0.2, step_s=0.05, first_batch_s=[0.5, 0.12])
    limit = host_limit(rec)
    assert limit.binds == "step"
    assert limit.steady_batches_per_s == pytest.approx(20.0)
    interval = 0.051
    # The workers' CPU per batch delivered: 0.4 cores over the steady interval, and over the second epoch's
    # first batch (0.12 s, one batch in 20).
    assert limit.cpu_s_per_batch == pytest.approx(0.4 * (19 * interval + 0.12) / 20, rel=0.05)
    # Each epoch's first batch is loaded with the step idle: as measured, once per 20 batches.
    assert limit.epoch_boundary_s == pytest.approx(0.12)
    assert limit.batches_per_s == pytest.approx(20 / (1 + 0.12))
    # Workers started anew each epoch show no such batch: one batch's CPU stands for it (a lower bound).
    fresh = make_recording(settings=Settings(num_workers=2), cpu_share=0.2, step_s=0.05, first_batch_s=[0.5, 0.5])
    assert host_limit(fresh).epoch_boundary_s == pytest.approx(host_limit(fresh).cpu_s_per_batch)
    assert "loading-io" in limit.unknown and "kept up" in limit.unknown["loading-io"]
    # This loop runs at the limit: the step binds, and its epochs' first batches are what the limit counts.
    assert share_of_limit(training_rate(rec), limit) == pytest.approx(1.0, abs=0.05)
    # A probe that cut the first epoch short: the second iter() took 0.3 s taking in what was left in flight,
    # which no loop of whole epochs pays; the first batch from an idle pipeline is the 0.12 s after it.
    cut = make_recording(settings=persistent, cpu_share=0.2, step_s=0.05, first_batch_s=[0.5, 0.42])
    cut.epochs[0].ended, cut.epochs[1].iter_s = "time", 0.3
    assert host_limit(cut).epoch_boundary_s == pytest.approx(0.12)


def test_taking_each_batch_in_from_the_workers_runs_between_two_steps():
    # Workers keep up with a 10 ms step; the training process spends 1.5 ms of CPU in next() per batch taking it
    # in: the loop cannot go faster than a batch every 11.5 ms, whatever the loaders do.
    persistent = Settings(num_workers=2, persistent_workers=True)
    rec = make_recording(settings=persistent, cpu_share=0.2, step_s=0.01, wait_s=0.002, first_batch_s=[0.5, 0.03])
    rec = dataclasses.replace(rec, batches=[dataclasses.replace(b, wait_cpu_s=0.0015) for b in rec.batches])
    limit = host_limit(rec)
    assert limit.binds == "step"
    assert limit.receive_s_per_batch == pytest.approx(0.0015)
    assert limit.steady_batches_per_s == pytest.approx(1 / 0.0115)
    # An epoch: its first batch (30 ms, taking it in included), then 19 intervals and the last step.
    assert limit.epoch_boundary_s == pytest.approx(0.03 - 0.0115 + 0.01)
    assert "the step binds (10.0 ms per batch, and 1.5 ms in next() taking each batch in)" in limit_words(limit, 80)
    # Without workers next() loads: nothing of it is taken for the step.
    in_process = make_recording(settings=MAIN_PROCESS, wait_s=0.001, step_s=0.01)
    assert host_limit(in_process).receive_s_per_batch is None


def test_a_stream_of_unknown_length_is_limited_by_its_steady_rate():
    rec = make_recording(settings=MAIN_PROCESS, wait_s=0.05, wait_cpu_share=1.0, step_s=0.02)
    stream = dataclasses.replace(
        rec, batches_per_epoch=None, epochs=[dataclasses.replace(e, ended="left") for e in rec.epochs]
    )
    limit = host_limit(stream)
    assert limit.epoch_batches is None
    assert limit.batches_per_s == limit.steady_batches_per_s == pytest.approx(40.0)
    assert "within an epoch" not in limit_words(limit, 10.0)


def test_an_unmeasurable_limit_says_why_and_makes_no_figure_up():
    rec = make_recording(settings=Settings(num_workers=2), step_s=None, worker_samples=[])
    limit = host_limit(rec)
    assert limit.batches_per_s is None and limit.binds is None
    assert set(limit.unknown) == {"loading-cpu", "loading-io", "step"}
    assert share_of_limit(10.0, limit) is None
    words = limit_words(limit, 10.0)
    assert words.startswith("unknown (") and "no training step" in words and "not sampled" in words
    assert limit.to_dict()["batches_per_s"] is None


def test_a_limit_known_only_from_the_step_is_an_upper_bound_and_says_so():
    """Workers' CPU not sampled (a run too short): the step alone gives a figure, which loading may undercut
    (a 4 ms step and 40 ms of CPU loading on 2 cores read as 'the step binds, 108 b/s' before)."""
    rec = make_recording(settings=Settings(num_workers=2), step_s=0.01, worker_samples=[])
    limit = host_limit(rec)
    assert limit.binds == "step" and "loading-cpu" in limit.unknown
    words = limit_words(limit, 10.0)
    assert f"of at most {limit.batches_per_s:.1f} batches/s: the step allows no more (" in words
    assert "the limit may be lower" in words and "binds" not in words


def test_the_steps_descheduled_time_is_not_the_steps_cost():
    """A 4 ms step whose thread waited 36 ms more for a core (loading's workers or other processes held them)
    read as a 40 ms step, and the limit blamed the step (issue 32.8: 'a 4 ms step read as 39.7 ms')."""
    rec = make_recording(settings=MAIN_PROCESS, wait_s=0.005, wait_cpu_share=1.0, step_s=0.04)
    for batch in rec.batches:
        batch.step_run_delay_s = 0.036
    limit = host_limit(rec)
    assert limit.step_s == pytest.approx(0.004)
    assert limit.step_batches_per_s == pytest.approx(250.0, rel=0.01)


def test_the_tuners_report_states_the_limit_its_worker_trials_measured():
    def trial(number: int, workers: int, rate: float, limit: float | None) -> Trial:
        run = Measurement(rate, "completed", 2.0, limit_batches_per_s=limit, limit_binds="loading-cpu")
        settings = Settings(num_workers=workers, persistent_workers=bool(workers))
        return Trial(number, settings, "workers", "measured", runs=[run])

    # The baseline (no workers) measures its own loading with torch's thread pool: not trusted for the limit.
    baseline, two = trial(1, 0, 16.0, 25.0), trial(2, 2, 37.5, 39.0)
    limits = Limits(2.0, 8 * 2**30, None, 8, "fork", False, False)
    tuning = LoaderTuning("train", [baseline, two], baseline, two, limits, 10.0, "converged", 20.0)
    assert baseline.limit_batches_per_s is None
    assert tuning.limit_dict() == {"batches_per_s": 39.0, "binds": "loading-cpu", "trial": 2, "note": None}
    data = tuning.to_dict()
    assert data["share_of_limit"] == pytest.approx(37.5 / 39, abs=0.001)
    assert data["baseline_share_of_limit"] == pytest.approx(16 / 39, abs=0.001)


def test_threads_past_the_limit_worker_processes_measured_are_told_why():
    # memory-heavy: 2 worker processes copy each 64 MB batch through shared memory (limit 25.3 batches/s, their
    # CPU counted); 2 threads pass the batches as they are and run at 33.
    two = Trial(2, Settings(num_workers=2, persistent_workers=True), "workers", "measured")
    two.runs.append(Measurement(24.3, "completed", 2.0, limit_batches_per_s=25.3, limit_binds="loading-cpu"))
    threads = Trial(3, Settings(num_workers=2, backend="thread"), "threads", "measured")
    threads.runs.append(Measurement(33.0, "completed", 2.0, limit_batches_per_s=20.0, limit_binds="loading-cpu"))
    limits = Limits(2.0, 8 * 2**30, None, 8, "fork", False, True)
    tuning = LoaderTuning("train", [two, threads], two, threads, limits, 10.0, "converged", 20.0)
    limit = tuning.limit_dict()
    assert limit is not None and limit["trial"] == 2 and tuning.share_of_limit(threads) == pytest.approx(33 / 25.3)
    assert "worker processes, whose CPU counts copying each batch" in limit["note"]
    console = Console(record=True, width=200)
    render(TuneReport("demo", {"train": tuning}), console)
    assert "(the limit was measured with worker processes, whose CPU counts copying" in console.export_text()
    within = LoaderTuning("train", [two, threads], threads, two, limits, 10.0, "converged", 20.0)
    assert within.limit_dict()["note"] is None  # the choice is within the limit: nothing to explain


def _report_with_fix(verdict: str, before: float, after: float, before_outcome: str = "completed") -> LoaderReport:
    original = make_recording(settings=MAIN_PROCESS, wait_s=0.05, wait_cpu_share=1.0, step_s=0.02)
    fixed = make_recording(settings=Settings(num_workers=2, persistent_workers=True), cpu_share=0.9, step_s=0.02)
    verification = Verification(
        fixed.settings, before, after, before_outcome, "completed", verdict, "", after_recording=fixed
    )
    return LoaderReport("train", original, [], verification)


@pytest.mark.parametrize(
    ("verdict", "before", "before_outcome"), [("faster", 14.0, "completed"), ("rescued", 0.0, "stalled")]
)
def test_the_fixs_share_is_of_the_limit_the_report_states(verdict: str, before: float, before_outcome: str):
    report = _report_with_fix(verdict, before, 30.0, before_outcome)
    stated = report.limit
    assert stated == host_limit(report.verification.after_recording)  # the workers' run measures the limit
    assert stated != host_limit(report.recording)
    data = report.to_dict()
    assert data["measurements"]["limit"] == stated.to_dict()
    assert data["verification"]["share_of_limit"] == pytest.approx(30.0 / stated.batches_per_s, abs=0.001)


def test_a_fix_that_failed_has_no_share_of_the_limit():
    report = _report_with_fix("failed", 14.0, 0.0)
    assert report.fixed_rate is None
    assert report.to_dict()["verification"]["share_of_limit"] is None


def test_loadings_cpu_per_batch_holds_for_a_long_run_that_kept_a_thinning_of_its_batches():
    rec = make_recording(settings=Settings(num_workers=2, persistent_workers=True), cpu_share=0.6, step_s=0.02)
    whole = worker_cpu_per_batch(rec)
    thinned = dataclasses.replace(rec, batches=rec.batches[::2], batches_delivered=len(rec.batches))
    assert whole is not None and worker_cpu_per_batch(thinned) == pytest.approx(whole, rel=0.15)
