"""The figures derived from a Recording (the one notion of a rate among them), on hand-made ones with exact values,
and that it is JSON-ready."""

from __future__ import annotations

import dataclasses
import json

import pytest
from recordings import MIB, make_host, make_iterators, make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.data import dataclass_from_dict
from loaderdoctor.recording import rates
from loaderdoctor.recording.rates import batches_per_s, epoch_batches, epoch_overhead_s, interval_s, training_rate
from loaderdoctor.recording.record import (
    AliveThread,
    BatchRecord,
    HostReading,
    OtherProcess,
    Recording,
    SampleError,
    StackFrame,
    Stall,
    StrayProcess,
    Window,
    WorkerDeath,
    WorkerReading,
    WorkerStack,
    startup_s,
    steady_batches,
    wait_fraction,
)
from loaderdoctor.render.console import measured_rows
from loaderdoctor.report import LoaderReport, measurements

IN_MAIN_PROCESS = Settings()


def _batch(epoch: int, index: int, wait_s: float = 0.01, step_s: float = 0.04, wait_cpu_s: float = 0.0):
    return BatchRecord(
        epoch=epoch, index=index, wait_s=wait_s, wait_cpu_s=wait_cpu_s, step_s=step_s, nbytes=1024, samples=4
    )


def _sample(pid: int, t_s: float, cpu_s: float = 0.0, uss_mb: float = 100.0) -> WorkerReading:
    return WorkerReading(
        t_s=t_s, pid=pid, uss_bytes=int(uss_mb * MIB), rss_bytes=int(uss_mb * MIB) * 2, cpu_s=cpu_s, threads=1
    )


def _small() -> Recording:
    """Two epochs of five batches in the main process: first batches 0.2 s and 0.1 s, then 10 ms + 40 ms step."""
    return make_recording(
        settings=IN_MAIN_PROCESS,
        epochs=2,
        batches_per_epoch=5,
        wait_s=0.01,
        first_batch_s=[0.2, 0.1],
        step_s=0.04,
        batch_bytes=MIB,
        batch_size=8,
        wait_cpu_share=0.5,
    )


# steady state


def test_steady_batches_leave_out_each_epochs_first_delivered_batch():
    rec = make_recording(
        settings=IN_MAIN_PROCESS,
        batches=[_batch(0, 0), _batch(0, 1), _batch(0, 2), _batch(1, 0), _batch(1, 1)],
        epochs=2,
    )
    assert [(b.epoch, b.index) for b in steady_batches(rec)] == [(0, 1), (0, 2), (1, 1)]


def test_steady_batches_leave_out_each_started_workers_first_batch():
    # 2 persistent workers start in epoch 0: batches 0 and 1 (worker 0's and worker 1's first) are start-up;
    # in epoch 1 the same workers go on and only the epoch's first batch is its start.
    batches = [_batch(e, i) for e in range(2) for i in range(4)]
    rec = make_recording(settings=Settings(num_workers=2, persistent_workers=True), batches=batches, epochs=2)
    assert [(b.epoch, b.index) for b in steady_batches(rec)] == [(0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    # Workers started anew every epoch: each epoch's first 2 batches are start-up.
    rec = make_recording(settings=Settings(num_workers=2), batches=batches, epochs=2)
    assert [(b.epoch, b.index) for b in steady_batches(rec)] == [(0, 2), (0, 3), (1, 2), (1, 3)]


def test_steady_batches_when_the_first_batch_failed():
    # Batch 0 of epoch 0 raised, so no BatchRecord: batch 1 is the first delivered and counts as start-up.
    rec = make_recording(batches=[_batch(0, 1), _batch(0, 2), _batch(0, 3), _batch(1, 0), _batch(1, 1)], epochs=2)
    assert [(b.epoch, b.index) for b in steady_batches(rec)] == [(0, 2), (0, 3), (1, 1)]


def test_steady_batches_of_nothing():
    assert steady_batches(make_recording(batches=[], epochs=1)) == []


def test_wait_fraction_uses_steady_batches_only():
    batches = [_batch(0, 0, wait_s=5.0, step_s=0.04)] + [_batch(0, i, wait_s=0.01, step_s=0.04) for i in range(1, 5)]
    assert wait_fraction(make_recording(batches=batches, epochs=1)) == pytest.approx(0.2)


def test_wait_fraction_is_none_without_a_step_or_without_time():
    assert wait_fraction(make_recording(step_s=None)) is None
    zero = [_batch(0, i, wait_s=0.0, step_s=0.0) for i in range(3)]
    assert wait_fraction(make_recording(batches=zero, epochs=1)) is None


def test_startup_s_sums_first_batches_and_counts_a_missing_one_as_zero():
    rec = make_recording(epochs=3, first_batch_s=[0.5, 0.25, 0.125])
    assert startup_s(rec) == pytest.approx(0.875)
    rec.epochs[1].first_batch_s = None
    assert startup_s(rec) == pytest.approx(0.625)


def test_batches_per_s():
    assert batches_per_s(make_recording(epochs=2, batches_per_epoch=20, wall_s=4.0)) == pytest.approx(10.0)
    assert batches_per_s(make_recording(wall_s=0.0)) == 0.0


# the rate of a training loop


WORKERS = Settings(num_workers=2, prefetch_factor=2, persistent_workers=False)
PERSISTENT = Settings(num_workers=2, prefetch_factor=2, persistent_workers=True)


def test_the_rate_counts_each_epochs_start_up_for_workers_started_anew():
    # 20 batches of 10 ms after a 1 s start-up, every epoch: 20 batches in 1.19 s.
    rec = make_recording(settings=WORKERS, step_s=None, epochs=3, wait_s=0.01, first_batch_s=1.0)
    assert interval_s(rec) == pytest.approx(0.01)
    assert epoch_overhead_s(rec) == pytest.approx(0.99)
    assert training_rate(rec) == pytest.approx(20 / 1.19)


def test_persistent_workers_pay_their_first_start_up_once_not_per_epoch():
    rec = make_recording(settings=PERSISTENT, step_s=None, epochs=3, wait_s=0.01, first_batch_s=[1.0, 0.01, 0.01])
    assert training_rate(rec) == pytest.approx(100.0)
    one_epoch = make_recording(settings=PERSISTENT, step_s=None, epochs=1, wait_s=0.01, first_batch_s=1.0)
    assert training_rate(one_epoch) == pytest.approx(100.0)


def test_persistent_workers_draining_an_epoch_cut_short_is_no_part_of_an_epochs_overhead():
    # A probe cuts its epochs short: the next iter() of persistent workers first takes in the 4 batches left in
    # flight (0.4 s), then the first batch comes 0.1 s later. A loop whose epochs run to their end pays the 0.1 s.
    whole = make_recording(settings=PERSISTENT, step_s=None, epochs=3, wait_s=0.01, first_batch_s=[1.0, 0.1, 0.1])
    cut = make_recording(settings=PERSISTENT, step_s=None, epochs=3, wait_s=0.01, first_batch_s=[1.0, 0.5, 0.5])
    for epoch in cut.epochs:
        epoch.ended = "time"
        epoch.iter_s = 0.4 if epoch.epoch else 0.0
    assert epoch_overhead_s(whole) == pytest.approx(0.09)
    assert epoch_overhead_s(cut) == pytest.approx(0.09)
    assert training_rate(cut) == pytest.approx(training_rate(whole))
    # After an epoch run to its end, iter() is part of the epoch's start, whatever it took.
    for epoch in whole.epochs:
        epoch.iter_s = 0.05
    assert epoch_overhead_s(whole) == pytest.approx(0.09)
    # Workers started anew each epoch: iter() starts them, a cost every epoch pays.
    anew = make_recording(settings=WORKERS, step_s=None, epochs=3, wait_s=0.01, first_batch_s=0.5)
    for epoch in anew.epochs:
        epoch.ended, epoch.iter_s = "time", 0.4
    assert epoch_overhead_s(anew) == pytest.approx(0.49)


def test_an_epochs_end_counts_as_its_overhead():
    rec = make_recording(settings=WORKERS, step_s=None, epochs=3, wait_s=0.01, first_batch_s=0.01)
    for epoch in rec.epochs:
        epoch.end_s = 0.35  # the workers' shutdown at StopIteration
    assert epoch_overhead_s(rec) == pytest.approx(0.35)
    assert training_rate(rec) == pytest.approx(20 / (0.35 + 0.2))


def test_a_run_shorter_than_an_epoch_is_extrapolated_to_the_epoch_length():
    rec = make_recording(settings=WORKERS, step_s=None, epochs=1, batches_per_epoch=5, wait_s=0.01, first_batch_s=1.0)
    rec.batches_per_epoch = 100  # the run was cut after 5 of the epoch's 100 batches
    assert training_rate(rec) == pytest.approx(100 / (0.99 + 100 * 0.01))


def test_a_stream_of_unknown_length_runs_at_its_steady_pace():
    rec = make_recording(settings=WORKERS, step_s=0.04, epochs=1, wait_s=0.01, first_batch_s=1.0)
    rec.batches_per_epoch = None
    rec.epochs[0].ended = "time"
    assert epoch_batches(rec) is None
    assert training_rate(rec) == pytest.approx(20.0)
    rec.epochs[0].ended = "exhausted"
    assert epoch_batches(rec) == 20


def test_the_rate_of_a_window_uses_its_batches_only():
    batches = [_batch(0, 0, wait_s=0.5)] + [_batch(0, i, wait_s=0.01 if i < 6 else 0.06) for i in range(1, 11)]
    rec = make_recording(settings=PERSISTENT, batches=batches, epochs=1)
    rec.batches_per_epoch = None
    first = Window(0.0, batches[5].delivered_s)
    second = Window(batches[6].delivered_s, batches[-1].delivered_s)
    assert training_rate(rec, first) == pytest.approx(1 / 0.05)
    assert training_rate(rec, second) == pytest.approx(1 / 0.10)
    rec.windows = [second]  # the run's measuring windows: batches outside them do not count
    assert [b.index for b in steady_batches(rec)] == list(range(6, 11))
    assert training_rate(rec) == pytest.approx(1 / 0.10)


def test_no_rate_without_steady_batches():
    rec = make_recording(batches=[_batch(0, 0)], epochs=1)
    assert training_rate(rec) is None


# measurements


def test_measurements_of_a_small_recording():
    m = measurements(_small())
    assert m == {
        "batches_per_s": 14.706,  # an epoch of 5 batches in 0.34 s: its first batch 0.1 s, then 50 ms each
        "batches_per_s_range": None,  # too few steady batches to read three stretches of them
        "ceiling": None,  # no data-free turns (run --ceiling)
        "samples_per_s": 117.647,
        "wait_fraction": 0.2,
        "interval_ms": 50.0,
        "epoch_overhead_s": 0.09,  # the second epoch's first batch, 0.1 s, against a 10 ms wait
        "first_startup_s": 0.2,
        "first_batch_s": [0.2, 0.1],
        "epochs": 2,
        "batches": 10,
        "batches_per_epoch": 5,
        "wall_s": 0.78,
        "run_batches_per_s": 12.821,  # 10 batches in 0.78 s, start-up included
        "step_ms": 40.0,
        "wait_ms_mean": 10.0,
        "wait_ms_p50": 10.0,
        "wait_ms_p95": 10.0,
        "wait_descheduled_ms_mean": None,  # the run delay was not read in this hand-made recording
        "batch_mb": 1.0,
        "loading_cores": 0.5,
        "loading_cpu_share": 0.5,
        "available_cores": 2.0,
        "other_processes_cores": None,
        "other_processes": [],
        "worker_uss_mb_max": None,
        "start_method": None,
        "outcome": "completed",
        "sample_errors": 0,
        # 5 ms of CPU and 5 ms more of waiting per batch in the main process, a 40 ms step: the step binds.
        "limit": {
            "batches_per_s": 23.81,  # 5 batches in 5 steps and the first batch's 10 ms of loading
            "binds": "step",
            "loading_cpu_batches_per_s": 400.0,  # 2 cores / 5 ms
            "loading_io_batches_per_s": 1600.0,  # 16 workers / 10 ms
            "step_batches_per_s": 25.0,
            "cpu_ms_per_batch": 5.0,
            "step_cpu_ms_per_batch": None,  # no samples of the machine
            "io_ms_per_batch": 5.0,
            "step_ms": 40.0,
            "receive_ms_per_batch": None,  # no workers: next() loads
            "steady_batches_per_s": 25.0,
            "epoch_batches": 5,
            "epoch_boundary_ms": 10.0,
            "usable_cores": 2.0,
            "unknown": {},
        },
        "share_of_limit": 0.618,  # 14.706 of 23.81
    }


def test_measurements_wait_percentiles_and_worker_memory():
    waits = [0.001 * i for i in range(1, 21)]  # steady waits 1..20 ms
    batches = [_batch(0, 0, wait_s=3.0)] + [_batch(0, i + 1, wait_s=w) for i, w in enumerate(waits)]
    samples = [_sample(1, 0.0, uss_mb=100.0), _sample(1, 1.0, uss_mb=256.0)]
    rec = make_recording(settings=Settings(num_workers=1), batches=batches, epochs=1, worker_samples=samples)
    m = measurements(rec)
    assert m["wait_ms_p50"] == 10.5
    assert m["wait_ms_mean"] == 10.5
    assert m["wait_ms_p95"] == 20.0
    assert m["worker_uss_mb_max"] == 256.0
    assert m["start_method"] == "fork"


def test_bimodal_waits_show_their_mean_beside_the_median():
    # Most batches ready, every third a long wait (four workers on one slow disk): the median says 0 ms while the
    # step waits a third of the time; the mean is what that share is made of.
    waits = [0.0, 0.0, 0.06] * 10
    batches = [_batch(0, 0, wait_s=1.0)] + [_batch(0, i + 1, wait_s=w, step_s=0.04) for i, w in enumerate(waits)]
    lr = LoaderReport("train", make_recording(settings=Settings(num_workers=4), batches=batches, epochs=1), [], None)
    m = measurements(lr.recording)
    assert (m["wait_ms_p50"], m["wait_ms_mean"]) == (0.0, 20.0)
    waiting = dict(measured_rows(lr))["waiting"]
    assert "20.0 ms per batch on average, median 0.0 ms" in waiting


def test_measurements_of_an_empty_run():
    rec = make_recording(batches=[], epochs=1, first_batch_s=[None], wall_s=0.0, step_s=None, outcome="stalled")
    m = measurements(rec)
    assert m["batches_per_s"] is None
    assert m["samples_per_s"] is None
    assert m["first_startup_s"] is None
    assert m["first_batch_s"] == [None]
    assert m["wait_ms_p50"] is None
    assert m["wait_ms_mean"] is None
    assert m["wait_ms_p95"] is None
    assert m["batch_mb"] is None
    assert m["step_ms"] is None
    assert m["outcome"] == "stalled"


def test_measurements_count_sample_errors():
    errors = [SampleError(0, 3, 12, "ValueError", "bad"), SampleError(0, 5, None, "KeyError", "'x'")]
    assert measurements(make_recording(sample_errors=errors))["sample_errors"] == 2


# JSON


def test_a_full_recording_is_json_ready():
    frame = StackFrame("/tmp/user.py", 12, "__getitem__")
    rec = make_recording(
        stall=Stall(
            epoch=1,
            batch=4,
            waited_s=12.5,
            threshold_s=10.0,
            reason="no batch",
            stacks=[WorkerStack(pid=1234, frames=[frame], stuck_frame=frame)],
            workers_cpu_idle=True,
        ),
        sample_errors=[SampleError(0, 3, 12, "ValueError", "bad")],
        worker_deaths=[WorkerDeath(1, 5, "DataLoader worker (pid 1234) exited unexpectedly")],
        outcome="stalled",
        pickled_dataset_bytes=4096,
    )
    rec.host.stray_workers.append(StrayProcess(pid=99, cmdline="python -c ...", cpu_percent=12.0, age_s=300.0))
    data = json.loads(json.dumps(rec.to_dict(), allow_nan=False))
    assert data["settings"] == rec.settings.to_dict()
    assert data["stall"]["stacks"][0]["stuck_frame"] == {"file": "/tmp/user.py", "line": 12, "function": "__getitem__"}
    assert data["host"]["stray_workers"][0]["pid"] == 99
    assert len(data["batches"]) == len(rec.batches) == 40
    assert data["outcome"] == "stalled"
    assert json.loads(json.dumps(measurements(rec), allow_nan=False))["outcome"] == "stalled"


def _recording_with_every_nested_kind() -> Recording:
    frame = StackFrame("/tmp/user.py", 12, "__getitem__")
    library_frame = StackFrame("/usr/lib/python3.11/threading.py", 320, "wait")
    threads = [AliveThread("tqdm_monitor", "tqdm/_monitor.py:60 in run", "tqdm"), AliveThread("loader", "")]
    rec = make_recording(
        settings=Settings(num_workers=2, prefetch_factor=4, persistent_workers=True, start_method="forkserver"),
        iterators=make_iterators(2, "forkserver", native_threads=3),
        windows=[Window(0.5, 1.5), Window(1.5, 2.25)],
        host_samples=[HostReading(0.0, 1000.0, 1.5), HostReading(0.25, 1000.5, 1.75)],
        other_processes=[OtherProcess(4321, "python other.py", 0.75)],
        sample_errors=[SampleError(0, 3, 12, "ValueError", "bad"), SampleError(1, 5, None, "KeyError", "'x'")],
        stall=Stall(
            epoch=1,
            batch=4,
            waited_s=12.5,
            threshold_s=10.0,
            reason="no batch",
            stacks=[
                WorkerStack(pid=1234, frames=[frame, library_frame], stuck_frame=frame),
                WorkerStack(pid=1235, frames=[library_frame], stuck_frame=None),
            ],
            workers_cpu_idle=True,
        ),
        worker_deaths=[WorkerDeath(1, 5, "DataLoader worker (pid 1234) exited unexpectedly")],
        outcome="stalled",
        error="stalled at batch 4",
        pickled_dataset_bytes=4096,
        dataset="Pairs",
        dataset_len=160,
    )
    rec.iterators[0] = dataclasses.replace(rec.iterators[0], threads=threads, cuda_initialized=True)
    rec.epochs[1].samples_fingerprinted, rec.epochs[1].distinct_samples = 80, 40
    rec.host.stray_workers.append(StrayProcess(pid=99, cmdline="python -c ...", cpu_percent=12.0, age_s=300.0))
    return rec


def test_a_recording_loads_back_from_its_json():
    rec = _recording_with_every_nested_kind()
    loaded = Recording.from_dict(json.loads(json.dumps(rec.to_dict(), allow_nan=False)))
    assert loaded == rec
    assert isinstance(loaded.settings, Settings)
    assert isinstance(loaded.stall, Stall) and loaded.stall.stacks[0].stuck_frame == StackFrame(
        "/tmp/user.py", 12, "__getitem__"
    )
    assert loaded.stall.stacks[1].stuck_frame is None
    assert (
        loaded.iterators[0].threads[0].describe() == "tqdm_monitor, a thread of tqdm running tqdm/_monitor.py:60 in run"
    )
    assert measurements(loaded) == measurements(rec)


def test_a_recording_without_a_stall_or_optional_facts_loads_back():
    rec = make_recording(step_s=None, host=make_host(shm_free_bytes=None, cgroup_cpu_quota=None))
    assert Recording.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec


@dataclasses.dataclass(frozen=True)
class _Part:
    name: str
    frames: list[StackFrame]


@dataclasses.dataclass
class _LaterFields:
    """Kinds of fields a Recording may gain later: each loads back with no change to from_dict."""

    parts: tuple[_Part, ...]
    by_rank: dict[str, Window]
    best: _Part | None
    pair: tuple[int, Settings]
    note: str = "default"


def test_fields_added_later_load_back_by_their_type_hints():
    frame = StackFrame("/tmp/user.py", 3, "load")
    value = _LaterFields(
        parts=(_Part("a", [frame]),), by_rank={"0": Window(0.0, 1.0)}, best=_Part("b", []), pair=(2, Settings())
    )
    data = json.loads(json.dumps(dataclasses.asdict(value)))
    assert dataclass_from_dict(_LaterFields, data) == value
    del data["note"]  # a field the sender did not know yet takes its default
    assert dataclass_from_dict(_LaterFields, data).note == "default"


def test_stack_frame_text():
    assert str(StackFrame("/tmp/user.py", 12, "load")) == "/tmp/user.py:12 in load"


def test_an_epochs_rate_counts_the_loops_time_not_a_pause_between_windows():
    rec = make_recording(epochs=2, batches_per_epoch=10, wait_s=0.01, step_s=0.04, first_batch_s=0.2)
    for epoch in rec.epochs:
        epoch.end_s = 0.05
    rec.epochs[1].wall_s += 30.0  # a measuring session paused 30 s within epoch 1
    # 0.2 s to the first batch, nine waits of 10 ms, ten steps of 40 ms, 50 ms to end: 10 batches in 0.74 s
    assert rates.epoch_rates(rec) == pytest.approx({0: 10 / 0.74, 1: 10 / 0.74})


def test_the_rate_range_is_the_slowest_and_fastest_of_three_stretches_of_steady_batches():
    rec = make_recording(epochs=1, batches_per_epoch=31, step_s=0.0, wait_s=0.01, first_batch_s=0.01)
    steady = steady_batches(rec)
    for batch in steady[2 * (len(steady) // 3) :]:  # the last third of the steady batches twice as slow
        batch.wait_s = 0.02
    low, high = rates.rate_range(rec)
    assert high == pytest.approx(100.0, rel=0.01) and low == pytest.approx(50.0, rel=0.01)
    assert low < training_rate(rec) < high
    assert rates.rate_range(make_recording(epochs=1, batches_per_epoch=12)) is None  # under 4 a stretch
