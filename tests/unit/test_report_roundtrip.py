"""Reports of check, tune and scale load back from their JSON (saved.load_report) and render as the live ones did;
a saved file that is no report says what is wrong with it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from recordings import MIB, make_activity, make_recording
from rich.console import Console

from loaderdoctor.errors import UsageError
from loaderdoctor.history import reports as history
from loaderdoctor.history.records import run_record
from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.epochcost import epoch_cost
from loaderdoctor.recording.record import OtherProcess, Recording, SampleError, StackFrame, Stall, WorkerStack
from loaderdoctor.render import console as check_render
from loaderdoctor.render import scale as scale_render
from loaderdoctor.render import tune as tune_render
from loaderdoctor.report import Finding, LoaderReport, Report, Verification
from loaderdoctor.saved import load_report, read_report
from loaderdoctor.scale.plan import ddp_plan
from loaderdoctor.scale.report import RankFigures, ScaleLoaderReport, ScaleReport, ScaleRun
from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.trial import Measurement, Trial

WORKERS = Settings(num_workers=2, persistent_workers=True)
BUSY = OtherProcess(4321, "python other.py", 0.75)

# The reports below hold only figures that to_dict writes as they are (rates to 3 decimals, memory to 0.1 MB):
# rounding changes none of them, so the live report and the one loaded back must agree to the last character.


def _check_report() -> Report:
    original = make_recording(
        settings=Settings(), wait_s=0.05, wait_cpu_share=1.0, step_s=0.02, other_processes=[BUSY], dataset="Poses"
    )
    fixed = make_recording(settings=WORKERS, cpu_share=0.9, step_s=0.02, worker_activity=make_activity())
    findings = [
        Finding(
            "input-bound",
            "critical",
            "The training step waits for data 71% of the time",
            {"wait_fraction": 0.714, "waits_ms": [50.0, 49.5, 50.25, 51.0, 48.0, 50.0, 52.5], "num_workers": 0},
            "Load in worker processes.",
            WORKERS.snippet(),
            settings_change={"num_workers": 2, "persistent_workers": True},
            impact=0.7142857142857143,
        ),
        Finding("stray-workers", "info", "1 stray worker process", {"pids": [4242]}, "End it.", "kill 4242"),
    ]
    verification = Verification(
        WORKERS, 14.25, 30.5, "completed", "completed", "faster", "2.14x faster", after_recording=fixed,
        spread=(1.9, 2.375), pairs=3, busy_pairs=1, before_startup_s=0.05, after_startup_s=0.25, other_cores=0.75,
        other_processes=[BUSY],
    )  # fmt: skip
    train = LoaderReport("train", original, findings, verification)
    train.epoch_cost = epoch_cost(train, 18_968, 32.0)
    return Report("demo", {"train": train, "val": LoaderReport("val", _stalled(), [_stall_finding()])})


def _stalled() -> Recording:
    """A recording whose workers hung in the user's __getitem__, with errors on the way."""
    frame = StackFrame("/data/poses.py", 41, "__getitem__")
    library = StackFrame("/usr/lib/python3.11/threading.py", 320, "wait")
    stall = Stall(
        1, 4, 12.5, 10.0, "no batch", [WorkerStack(7, [frame, library], frame), WorkerStack(8, [library], None)], True
    )
    return make_recording(
        settings=WORKERS,
        stall=stall,
        outcome="stalled",
        error="stalled at batch 4",
        sample_errors=[SampleError(0, 3, 12, "ValueError", "bad"), SampleError(1, 2, None, "KeyError", "'x'")],
    )


def _stall_finding() -> Finding:
    return Finding(
        "stall", "critical", "No batch came for 12.5 s", {"waited_s": 12.5, "stuck_at": "pid 7 at /data/poses.py:41"},
        "Find what __getitem__ waits for.", None, impact=1.0,
    )  # fmt: skip


def _tune_report() -> TuneReport:
    limits = Limits(2.0, 8 * 2**30, 24 * 2**30, 8, "fork", False, True)
    run = Measurement(10.0, "completed", 3.0, memory_bytes=None, startup_s=0.05)
    workers = [
        Measurement(30.125, "completed", 3.0, 412 * MIB, 1.75, True, limit_batches_per_s=39.0, limit_binds="step"),
        Measurement(31.5, "completed", 2.875, 2 * 412 * MIB, 1.8, True, limit_batches_per_s=40.0, limit_binds="step"),
    ]
    trials = [
        Trial(1, Settings(), "baseline", "measured", [run]),
        Trial(2, WORKERS, "workers", "measured", workers),
        Trial(3, Settings(num_workers=4, persistent_workers=True), "workers", "stalled",
              [Measurement(0.0, "stalled", 10.5, error="no batch came for 10 s")], note="stuck at dataset.py:42"),
        Trial(4, Settings(num_workers=8, persistent_workers=True), "workers", "over-memory", note="predicted 3.3 GB"),
    ]  # fmt: skip
    streaming = "litdata.StreamingDataLoader"
    chosen = LoaderTuning("train", trials, trials[0], trials[1], limits, 12.25, "budget", 20.0, streaming)
    interrupted = LoaderTuning("val", trials[:1], trials[0], trials[0], limits, 3.0, "interrupted", None)
    return TuneReport("demo", {"train": chosen, "val": interrupted})


def _scale_report() -> ScaleReport:
    limit = {"batches_per_s": 20.0, "binds": "loading-cpu"}
    one = ScaleRun(1, 320.0, 1.0, 1, [RankFigures(0, 320.0, 0.1, 100, "completed", limit, 0.9)])
    two = ScaleRun(
        2, 400.0, 0.625, 1,
        [RankFigures(0, 200.0, 0.45, 100, "completed", limit, 0.55), RankFigures(1, None, None, 0, "failed")],
        failures=["rank 1 stalled at epoch 1 batch 16 (pid 7 at /data/pose.py:41 in __getitem__)"],
    )  # fmt: skip
    finding = Finding(
        "lock-contention", "warning", "Workers wait on a file lock", {"ranks": [0, 1], "lock_share": 0.7},
        "Open the file read-only without the lock.", None, impact=0.7,
    )  # fmt: skip
    proof = Verification(
        WORKERS, 400.0, 610.5, "completed", "completed", "faster", "without the lock: 1.53x", source="lock-free",
        pairs=1,
    )  # fmt: skip
    plan = ddp_plan(1003, 6, 2, grad_accum=3, drop_last=True, base_lr=3e-4)
    loader = ScaleLoaderReport("train", [one, two], [finding], proof, plan)
    return ScaleReport("scenario:x", {"train": loader}, nnodes=2)


def _rendered(report: Any) -> str:
    console = Console(record=True, width=120, force_terminal=False, file=io.StringIO())
    render = {Report: check_render.render, TuneReport: tune_render.render, ScaleReport: scale_render.render}
    render[type(report)](report, console)
    return console.export_text()


def _loaded(report: Any) -> Any:
    return load_report(json.loads(json.dumps(report.to_dict(), allow_nan=False)))


REPORTS = [_check_report, _tune_report, _scale_report]


@pytest.mark.parametrize("make", REPORTS)
def test_a_report_loads_back_from_its_json_as_it_was_written(make):
    report = make()
    written = json.loads(json.dumps(report.to_dict()))
    loaded = load_report(written)
    assert type(loaded) is type(report)
    assert loaded.to_dict() == report.to_dict()  # the plan's tuples are lists in JSON: compared before and after it
    assert json.loads(json.dumps(loaded.to_dict())) == written
    assert _rendered(loaded) == _rendered(report)
    assert loaded.exit_status == report.exit_status


def test_a_check_report_keeps_its_findings_fix_and_figures():
    report = _check_report()
    loaded = _loaded(report)
    train, was = loaded.loaders["train"], report.loaders["train"]
    assert loaded.critical and loaded.exit_status == 1
    assert train.recording == was.recording and train.verification.after_recording == was.verification.after_recording
    assert train.findings == was.findings  # settings_change and impact too: prescribe and the order read them
    assert train.verification == was.verification
    assert train.verification.spread == (1.9, 2.375) and train.verification.other_processes == [BUSY]
    assert train.verification.speedup == was.verification.speedup and train.verification.helped
    assert train.limit == was.limit and train.limit.batches_per_s is not None
    assert train.fixed_rate == was.fixed_rate == 30.5
    assert train.epoch_cost == was.epoch_cost and train.epoch_cost.words() == was.epoch_cost.words()
    stall = loaded.loaders["val"].recording.stall
    assert stall.stacks[0].stuck_at() == "pid 7 at /data/poses.py:41 in __getitem__" and stall.hung
    assert loaded.loaders["val"].verification is None and loaded.loaders["val"].epoch_cost is None


STARTED, ENDED = "2026-11-25T20:00:00.000+00:00", "2026-11-25T20:01:00.000+00:00"


def test_the_history_keeps_the_same_run_of_a_loaded_check_report():
    report, loaded = _check_report(), _loaded(_check_report())
    for name, was in report.loaders.items():
        kept = [
            run_record("check", name, lr, STARTED, ENDED, {"cpu_count": 2}, "demo")
            for lr in (was, loaded.loaders[name])
        ]
        assert kept[0] == kept[1]


@pytest.mark.parametrize("make", [_tune_report, _scale_report])
def test_the_history_keeps_the_same_run_of_a_loaded_tune_or_scale_report(make, monkeypatch):
    monkeypatch.setattr(history, "now_iso", lambda: ENDED)
    runs = history._tune_runs if make is _tune_report else history._scale_runs
    assert runs(_loaded(make()), STARTED, {}) == runs(make(), STARTED, {})


def test_a_tune_report_keeps_its_chosen_and_baseline_among_its_trials():
    report = _tune_report()
    loaded = _loaded(report)
    train, was = loaded.loaders["train"], report.loaders["train"]
    assert train.trials == was.trials
    assert train.chosen is train.trials[1] and train.baseline is train.trials[0]  # the renderers compare with `is`
    assert train.trials[1].runs[1].memory_bytes == 2 * 412 * MIB and train.trials[1].memory_bytes == 2 * 412 * MIB
    assert train.speedup == was.speedup and train.limit_dict() == was.limit_dict() == {
        "batches_per_s": 39.5, "binds": "step", "trial": 2, "note": None,
    }  # fmt: skip
    assert train.found and train.settings == WORKERS and train.limits == was.limits
    # The snippet makes the loader of its own class, as written and as loaded back.
    assert train.loader_class == "litdata.StreamingDataLoader"
    assert train.snippet().startswith("loader = StreamingDataLoader(dataset") and train.snippet() == was.snippet()
    assert train.trials[2].runs[0].error == "no batch came for 10 s" and not train.trials[2].usable
    val = loaded.loaders["val"]
    assert val.chosen is val.baseline and val.stopped == "interrupted" and val.step_ms is None
    assert loaded.exit_status == report.exit_status == 0


def test_a_measurements_memory_comes_back_in_bytes_to_the_tenth_of_a_megabyte():
    written = Measurement(12.0, "completed", 1.0, memory_bytes=123_456_789).to_dict()
    assert written["memory_mb"] == 117.7
    loaded = Measurement.from_dict(written)
    assert loaded.memory_bytes == round(117.7 * MIB) and loaded.to_dict() == written


def test_a_scale_report_keeps_its_runs_plan_and_proof():
    report = _scale_report()
    loaded = _loaded(report)
    train, was = loaded.loaders["train"], report.loaders["train"]
    assert loaded == report
    assert train.runs[1].base_ranks == 1 and train.runs[1].failed and loaded.critical and loaded.exit_status == 1
    assert train.plan == was.plan and train.verification.source == "lock-free" and loaded.nnodes == 2


def _unrounded_check_report() -> Report:
    """A check report whose fix's rates and start-ups have more digits than to_dict writes."""
    report = _check_report()
    verification = report.loaders["train"].verification
    verification.before, verification.after = 14.2449999, 31.0495123
    verification.before_startup_s, verification.other_cores = 0.0504999, 0.7549
    return report


def _unrounded_tune_report() -> TuneReport:
    """A tune report whose runs' rates, seconds and memory have more digits than to_dict writes."""
    report = _tune_report()
    trial = report.loaders["train"].trials[1]
    trial.runs = [Measurement(30.12549, "completed", 3.00049, 412 * MIB + 51_000, 1.7549, True, limit_batches_per_s=39)]
    return report


@pytest.mark.parametrize("make", [_unrounded_check_report, _unrounded_tune_report])
def test_a_report_loaded_back_saves_and_renders_the_same_ever_after(make):
    once = _loaded(make())
    twice = _loaded(once)
    assert twice.to_dict() == once.to_dict()
    assert _rendered(twice) == _rendered(once)


# What a file that is no report says


def _error(data: Any) -> UsageError:
    with pytest.raises(UsageError) as raised:
        load_report(data, source="report.json")
    assert raised.value.exit_status == 2
    return raised.value


def test_a_file_that_is_not_there_or_not_json_says_so(tmp_path: Path):
    with pytest.raises(UsageError, match=r"no saved report at .*missing\.json: the file does not exist"):
        read_report(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "loaderdoctor.check/1",\n  "target": }\n')
    with pytest.raises(UsageError, match=r"broken\.json is not JSON: Expecting value at line 2, column 13"):
        read_report(broken)
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(_scale_report().to_dict()))
    assert read_report(saved) == _scale_report()


def test_an_error_document_is_said_to_hold_an_error_not_a_report():
    error = _error({"schema": "loaderdoctor.check/1", "error": "no loader in 'x.py'", "hint": "return a DataLoader"})
    assert error.message == "report.json holds an error, not a report: no loader in 'x.py'"
    assert "return a DataLoader" in error.hint


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"target": "demo", "loaders": {}}, "report.json has no schema"),
        ({"schema": "loaderdoctor.history/1", "runs": []}, "the unknown schema 'loaderdoctor.history/1'"),
        ([1, 2], "report.json is not a report: a report is a JSON object, not a list"),
    ],
)
def test_a_document_without_a_known_schema_names_the_schemas_known(data, words):
    error = _error(data)
    assert words in error.message
    if isinstance(data, dict):
        assert all(schema in error.hint for schema in ("check/1", "tune/1", "scale/1"))


def test_a_check_report_saved_before_recordings_were_kept_asks_for_a_new_check():
    data = _check_report().to_dict()
    del data["loaders"]["val"]["recording"]
    error = _error(data)
    assert "saved by an older loaderdoctor" in error.message and "loaders.val " in error.message
    assert "run `loaderdoctor check` again" in error.hint


def _without(data: dict[str, Any], *path: str) -> dict[str, Any]:
    """`data` (a fresh report's dict) without the key at the end of `path`."""
    inner = data
    for key in path[:-1]:
        inner = inner[key]
    del inner[path[-1]]
    return data


@pytest.mark.parametrize(
    ("make", "change", "words"),
    [
        (_check_report, lambda d: _without(d, "loaders", "train", "verification", "before"),
         "loaders.train.verification.before: missing"),
        (_check_report, lambda d: d["loaders"]["val"]["findings"][0].update(severity="fatal"),
         "loaders.val.findings[0]: unknown severity 'fatal'"),
        (_check_report, lambda d: d["loaders"]["train"]["recording"]["settings"].update(num_workers=-1),
         "loaders.train.recording.settings: num_workers must be 0 or more, not -1"),
        (_tune_report, lambda d: _without(d, "loaders", "val", "trials"), "loaders.val.trials: missing"),
        (_scale_report, lambda d: d["loaders"]["train"].update(runs=7),
         "loaders.train.runs: expected a list, got a number"),
        (_scale_report, lambda d: _without(d, "target"), "target: missing"),
    ],
)  # fmt: skip
def test_a_malformed_report_names_the_fields_path_and_what_is_wrong(make, change, words):
    data = json.loads(json.dumps(make().to_dict()))
    change(data)
    error = _error(data)
    assert error.message.startswith(f"report.json is not a valid {data['schema']} report: ")
    assert error.message.endswith(words)


def test_a_run_report_keeps_the_processes_it_could_not_watch():
    from loaderdoctor.report import UnwatchedProcess

    report = _check_report()
    report.command = "run"
    report.unwatched = [
        UnwatchedProcess(4242, 1, "it ended before writing what it measured"),
        UnwatchedProcess(None, 2, "it sent nothing of what it measured"),
        UnwatchedProcess(77, None, "it registered and still runs", "python eval.py"),
    ]
    loaded = _loaded(report)
    assert loaded.unwatched == report.unwatched
    assert [p.words() for p in loaded.unwatched] == [
        "rank 1 (pid 4242) could not be watched: it ended before writing what it measured",
        "rank 2 could not be watched: it sent nothing of what it measured",
        "process 77 (python eval.py) could not be watched: it registered and still runs",
    ]
