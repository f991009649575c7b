"""run-degradation on hand-made RunRecords: when a run is flagged, and what it names as the cause."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from loaderdoctor.history.degradation import run_degradation
from loaderdoctor.history.records import RunRecord
from loaderdoctor.host.snapshot import HostSnapshot
from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import OtherProcess, StrayProcess

GIB = 2**30
SETTINGS = Settings(num_workers=2, persistent_workers=True)
HOG = OtherProcess(pid=4242, cmdline="python hog.py", cores=0.97, same_user=True)
HOG_2 = OtherProcess(pid=4243, cmdline="python hog.py --threads 1", cores=0.95, same_user=True)
STRAY = StrayProcess(
    pid=5151,
    cmdline="python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
    cpu_percent=90.0,
    age_s=7200.0,
)


def make_host(**overrides: Any) -> dict[str, Any]:
    """A quiet 2-core machine, as take_snapshot() writes it: nothing else running, memory and /dev/shm free."""
    snapshot = HostSnapshot(
        hostname="gpu-1",
        cpu_count=2,
        usable_cores=2.0,
        affinity_cores=2,
        load_avg_1m=0.2,
        load_avg_5m=0.2,
        load_avg_15m=0.2,
        memory_available_bytes=12 * GIB,
        memory_total_bytes=16 * GIB,
        swap_used_bytes=0,
        swap_total_bytes=4 * GIB,
        shm_used_bytes=0,
        shm_total_bytes=8 * GIB,
        open_fds=12,
        fd_soft_limit=1024,
        stray_workers=[],
        python_version="3.11.7",
        torch_version="2.13.0+cpu",
    )
    return dataclasses.replace(snapshot, **overrides).to_dict()


def make_run(
    rate: float,
    *,
    run_id: int | None = None,
    name: str = "train",
    kind: str = "watch",
    settings: Settings = SETTINGS,
    host: dict[str, Any] | None = None,
    step_ms: float = 40.0,
    wait_fraction: float = 0.1,
    batch_size: int = 32,
    dataset_len: int = 6400,
    outcome: str = "completed",
) -> RunRecord:
    """A run of `rate` batches per second (samples per second to match its batch size)."""
    return RunRecord(
        name=name,
        kind=kind,
        started_at=f"2026-05-01T10:{run_id or 59:02d}:00.000+00:00",
        ended_at=f"2026-05-01T10:{run_id or 59:02d}:30.000+00:00",
        host=host if host is not None else make_host(),
        settings=settings.to_dict(),
        measurements={
            "batches_per_s": rate,
            "samples_per_s": rate * batch_size,
            "step_ms": step_ms,
            "interval_ms": 1000 / rate,
            "wait_fraction": wait_fraction,
            "outcome": outcome,
        },
        findings=[],
        dataset={"name": "ImageFolder", "len": dataset_len, "batch_size": batch_size, "batches_per_epoch": 200},
        id=run_id,
    )


def history(*rates: float, **options: Any) -> list[RunRecord]:
    """Earlier runs of 'train' at `rates`, newest first (ids count down from 10)."""
    return [make_run(rate, run_id=10 - i, **options) for i, rate in enumerate(rates)]


def test_a_run_slowed_by_other_processes_names_them_first():
    host = make_host(other_processes=[HOG, HOG_2], load_avg_1m=2.3)
    run = make_run(12.3, host=host, wait_fraction=0.55)
    finding = run_degradation(run, history(20.0, 20.8, 21.5))
    assert finding is not None
    assert finding.rule == "run-degradation"
    assert finding.severity == "warning"
    assert finding.title == (
        "12.3 batches/s, 41% below the median of the last 3 runs of 'train' (20.8): other processes took 1.9 of 2 "
        "cores: pid 4242 python hog.py (0.97 cores), pid 4243 python hog.py (0.95 cores)"  # no arguments
    )
    evidence = finding.evidence
    assert evidence["rate"] == 12.3
    assert evidence["baseline_rate"] == 20.8
    assert evidence["ratio"] == pytest.approx(12.3 / 20.8, abs=1e-3)
    assert evidence["likeliest_cause"] == "other_processes"
    assert [c["what"] for c in evidence["changes"]] == ["other_processes", "load_avg_1m", "wait_fraction"]
    assert evidence["changes"][0]["before"] == 0.0
    assert evidence["changes"][0]["now"] == pytest.approx(1.92)
    assert [p["pid"] for p in evidence["named_processes"]] == [4242, 4243]
    assert [r["id"] for r in evidence["compared_runs"]] == [10, 9, 8]
    assert "yours can be ended (kill 4242 4243)" in finding.fix
    assert "renice -n 19 -p 4242 4243" in finding.fix
    assert finding.impact == pytest.approx(1 - 12.3 / 20.8)


@pytest.mark.parametrize(
    ("owners", "told"),
    [
        ((True, False), "pid 4243 belongs to another user: ask its owner"),
        ((False, False), "pids 4242 4243 belong to other users: ask their owners"),
        ((None, None), "pids 4242 4243 may not be yours: ask their owners"),
    ],
)
def test_other_users_processes_are_never_to_be_killed_or_reniced(owners, told):
    mine, other = (dataclasses.replace(p, same_user=o) for p, o in zip((HOG, HOG_2), owners, strict=True))
    finding = run_degradation(make_run(12.3, host=make_host(other_processes=[mine, other])), history(20.0, 20.8))
    assert told in finding.fix
    assert "4243" not in (finding.snippet or "") and "kill 4243" not in finding.fix
    if owners[0]:
        assert finding.snippet == "renice -n 19 -p 4242  # or end them: kill 4242"
    else:
        assert finding.snippet is None and "kill" not in finding.fix and "renice" not in finding.fix
    assert [p["same_user"] for p in finding.evidence["named_processes"]] == list(owners)


def test_a_process_that_was_as_busy_before_is_not_named():
    usual = OtherProcess(pid=77, cmdline="/usr/bin/dockerd", cores=0.3)
    earlier = history(20.0, 20.0, host=make_host(other_processes=[dataclasses.replace(usual, pid=70)]))
    run = make_run(10.0, host=make_host(other_processes=[usual, HOG, HOG_2]))
    finding = run_degradation(run, earlier)
    assert finding.evidence["likeliest_cause"] == "other_processes"
    assert [p["pid"] for p in finding.evidence["named_processes"]] == [4242, 4243]
    assert "(0.3 before)" in finding.title
    assert "dockerd" not in finding.title


def test_an_unchanged_run_within_noise_is_not_flagged():
    assert run_degradation(make_run(19.0), history(20.0, 20.8, 21.5)) is None
    assert run_degradation(make_run(16.8), history(20.0, 20.8, 21.5)) is None  # 0.81 of the median
    assert run_degradation(make_run(25.0), history(20.0)) is None  # faster


def test_a_single_earlier_run_suffices():
    finding = run_degradation(make_run(12.0, host=make_host(other_processes=[HOG])), history(20.0))
    assert finding.title.startswith("12 batches/s, 40% below the last run of 'train' (20): other processes took 1")
    assert finding.evidence["compared_runs"] == [
        {"id": 10, "started_at": "2026-05-01T10:10:00.000+00:00", "rate": 20.0}
    ]


def test_no_earlier_run_no_finding():
    assert run_degradation(make_run(1.0), []) is None


def test_runs_of_another_name_or_kind_are_ignored():
    others = [
        make_run(100.0, run_id=20, name="val"),
        make_run(100.0, run_id=21, kind="check"),
        make_run(100.0, run_id=22, name="train-big"),
    ]
    assert run_degradation(make_run(19.0), [*others, *history(20.0)]) is None
    assert run_degradation(make_run(19.0), others) is None
    finding = run_degradation(make_run(10.0), [*others, *history(20.0, 20.0)])
    assert [r["id"] for r in finding.evidence["compared_runs"]] == [10, 9]


def test_runs_that_did_not_complete_are_left_out_and_five_at_most_are_compared():
    stalled = make_run(1.0, run_id=30, outcome="stalled")
    finding = run_degradation(make_run(10.0), [stalled, *history(20.0, 20.0, 20.0, 20.0, 20.0, 2.0, 2.0)])
    assert [r["id"] for r in finding.evidence["compared_runs"]] == [10, 9, 8, 7, 6]
    assert finding.evidence["baseline_rate"] == 20.0


def test_the_run_itself_among_the_earlier_runs_is_not_compared():
    run = make_run(10.0, run_id=11)
    assert run_degradation(run, [run]) is None


def test_stray_workers_are_named_with_their_pids():
    run = make_run(0.5, host=make_host(stray_workers=[STRAY], other_processes=[OtherProcess(5151, STRAY.cmdline, 0.8)]))
    finding = run_degradation(run, history(2.0, 2.0))
    assert finding.severity == "critical"
    assert finding.title == (
        "0.5 batches/s, 75% below the median of the last 2 runs of 'train' (2): 1 stray DataLoader worker of earlier "
        "runs took 0.9 cores: pid 5151 python -c (0.90 cores)"  # its program, never its arguments
    )
    # The stray is not named again among the other processes, though the run measured it too.
    assert [c["what"] for c in finding.evidence["changes"]] == ["stray_workers"]
    assert finding.evidence["named_processes"][0] | {"cmdline": ""} == {
        "pid": 5151,
        "cmdline": "",
        "cores": 0.9,
        "stray": True,
    }
    assert finding.snippet == "kill 5151"
    assert "kill 5151" in finding.fix


def test_strays_that_were_there_before_too_are_no_change():
    host = make_host(stray_workers=[STRAY])
    finding = run_degradation(make_run(10.0, host=host), history(20.0, host=host))
    assert finding.evidence["changes"] == []
    assert finding.title.endswith(": no measured change explains it (host, settings and data as before)")
    assert "loaderdoctor check" in finding.fix


def test_a_slower_step_with_the_same_wait_share_blames_the_step():
    finding = run_degradation(make_run(11.0, step_ms=82.0, wait_fraction=0.11), history(20.0, 20.0, step_ms=40.0))
    assert finding.evidence["likeliest_cause"] == "step_ms"
    change = finding.evidence["changes"][0]
    assert (change["before"], change["now"]) == (40.0, 82.0)
    assert change["words"] == (
        "the training step took 82 ms a batch, up from 40 ms, and the share of time waiting on data did not rise "
        "(11%, 10% before): the slowdown is the model's step, not the input"
    )
    assert finding.title.endswith(change["words"])
    assert "not the input" in finding.fix
    assert "torch.profiler" in finding.fix


def test_processes_taking_cores_outrank_a_slower_step_that_came_with_more_waiting():
    run = make_run(8.0, step_ms=60.0, wait_fraction=0.5, host=make_host(other_processes=[HOG, HOG_2]))
    finding = run_degradation(run, history(20.0, step_ms=40.0))
    whats = [c["what"] for c in finding.evidence["changes"]]
    assert whats[0] == "other_processes"
    assert "step_ms" in whats
    step = next(c for c in finding.evidence["changes"] if c["what"] == "step_ms")
    assert "not the input" not in step["words"]


def test_a_settings_change_is_named_with_before_and_now():
    earlier = history(20.0, 21.0, settings=Settings(num_workers=4, persistent_workers=True))
    finding = run_degradation(make_run(8.0, settings=Settings(num_workers=0)), earlier)
    assert finding.severity == "critical"
    assert "below the median of the last 2 runs of 'train' with other settings (20.5)" in finding.title
    change = finding.evidence["changes"][0]
    assert change == {
        "what": "settings",
        "before": {"num_workers": 4, "persistent_workers": True},
        "now": {"num_workers": 0, "persistent_workers": False},
        "words": "the settings changed: num_workers 4 -> 0, persistent_workers True -> False",
    }
    assert finding.evidence["same_settings"] is False
    assert finding.settings_change == {"num_workers": 4, "persistent_workers": True}
    assert finding.snippet == Settings(num_workers=4, persistent_workers=True).snippet()
    assert "num_workers=4" in finding.fix


def test_the_settings_restored_are_written_for_the_loaders_own_class():
    earlier = history(20.0, 21.0, settings=Settings(num_workers=4, persistent_workers=True))
    for run in earlier:
        run.dataset["loader_class"] = "torchdata.stateful_dataloader.StatefulDataLoader"
    now = make_run(8.0, settings=Settings(num_workers=0))
    now.dataset["loader_class"] = "torchdata.stateful_dataloader.StatefulDataLoader"
    finding = run_degradation(now, earlier)
    assert finding.snippet.startswith("loader = StatefulDataLoader(dataset, batch_size=..., num_workers=4")


def test_runs_with_the_same_settings_are_preferred():
    other = history(5.0, 5.0, settings=Settings(num_workers=0))
    same = [make_run(20.0, run_id=3), make_run(20.0, run_id=2)]
    finding = run_degradation(make_run(10.0), [*other, *same])
    assert [r["id"] for r in finding.evidence["compared_runs"]] == [3, 2]
    assert finding.evidence["same_settings"] is True
    assert "settings" not in [c["what"] for c in finding.evidence["changes"]]


def test_critical_below_half_warning_above():
    earlier = history(20.0, 20.0)
    assert run_degradation(make_run(9.9), earlier).severity == "critical"
    assert run_degradation(make_run(10.1), earlier).severity == "warning"


def test_a_larger_batch_compares_samples_per_second():
    earlier = history(20.0, 20.0, batch_size=32)
    assert run_degradation(make_run(10.0, batch_size=64), earlier) is None  # 640 samples/s as before
    finding = run_degradation(make_run(5.0, batch_size=64), earlier)
    assert finding.evidence["unit"] == "samples_per_s"
    assert finding.title.startswith("320 samples/s, 50% below")
    assert finding.evidence["changes"][0]["words"] == "the data changed: batch_size 32 -> 64"


def test_host_changes_are_named_and_the_evidence_is_plain_json():
    host = make_host(
        hostname="gpu-2",
        other_processes=[HOG, HOG_2],
        stray_workers=[dataclasses.replace(STRAY, cpu_percent=60.0)],
        load_avg_1m=3.9,
        memory_available_bytes=2 * GIB,
        swap_used_bytes=GIB,
        shm_used_bytes=3 * GIB,
        open_fds=900,
    )
    run = make_run(3.0, host=host, dataset_len=12800, wait_fraction=0.7)
    finding = run_degradation(run, history(20.0, 20.0, 21.0))
    whats = [c["what"] for c in finding.evidence["changes"]]
    assert whats == [
        "other_processes",
        "stray_workers",
        "dataset",
        "hostname",
        "load_avg_1m",
        "memory_available_bytes",
        "swap_used_bytes",
        "open_fds",
        "shm_used_bytes",
        "wait_fraction",
    ]
    words = {c["what"]: c["words"] for c in finding.evidence["changes"]}
    assert words["swap_used_bytes"] == "swap in use 1.0 GB, up from 0 MB: the machine pages to disk"
    assert words["memory_available_bytes"] == "memory available 2.0 GB of 16.0 GB, down from 12.0 GB"
    assert words["shm_used_bytes"] == "/dev/shm held 3.0 GB of 8.0 GB at the start, up from 0 MB"
    assert words["open_fds"] == "the process had 900 files open at the start (limit 1024), up from 12"
    assert words["hostname"] == "the run ran on gpu-2, the run before on gpu-1"
    assert words["dataset"] == "the data changed: len 6400 -> 12800"
    # Both kinds of processes taking cores in earnest: both fixes.
    assert "kill 4242 4243" in finding.fix
    assert "kill 5151" in finding.fix
    assert json.loads(json.dumps(finding.to_dict())) == finding.to_dict()
    assert json.loads(json.dumps(finding.evidence)) == finding.evidence


def test_records_without_host_facts_are_compared_by_rate_alone():
    earlier = [dataclasses.replace(r, host={}, dataset={}) for r in history(20.0, 20.0)]
    finding = run_degradation(make_run(10.0, host={}), earlier)
    assert finding.evidence["changes"] == []
    assert finding.evidence["ratio"] == 0.5


def test_more_workers_are_not_ruled_out_while_the_loop_still_waits_on_data():
    # input-bound would prescribe workers at 11% waiting: the run's finding must not say they will not help
    finding = run_degradation(make_run(11.0, step_ms=82.0, wait_fraction=0.11), history(20.0, 20.0, step_ms=40.0))
    assert "more workers will not help" not in finding.fix
    idle = run_degradation(make_run(11.0, step_ms=82.0, wait_fraction=0.02), history(20.0, 20.0, step_ms=40.0))
    assert "more workers will not help" in idle.fix


def test_a_step_slowed_beside_processes_taking_cores_is_not_blamed_on_the_model():
    # the same processes took the cores before too: no change in them, but the step is no cause of its own
    host = make_host(other_processes=[HOG, HOG_2])
    finding = run_degradation(
        make_run(11.0, step_ms=82.0, wait_fraction=0.11, host=host),
        history(20.0, 20.0, step_ms=40.0, host=host),
    )
    step = next(c for c in finding.evidence["changes"] if c["what"] == "step_ms")
    assert "the model's step" not in step["words"] and "other processes took" in step["words"]
    assert "more workers will not help" not in finding.fix


def test_no_measured_change_never_says_host_as_before_while_others_took_the_cores():
    host = make_host(other_processes=[HOG, HOG_2])
    finding = run_degradation(make_run(11.0, host=host), history(20.0, 20.0, host=host))
    assert "host, settings and data as before" not in finding.title
    assert "other processes took" in finding.title


def test_inside_a_check_the_fix_does_not_say_to_run_a_check():
    finding = run_degradation(make_run(11.0, kind="check"), history(20.0, 20.0, kind="check"))
    assert "run loaderdoctor check" not in finding.fix
    watched = run_degradation(make_run(11.0), history(20.0, 20.0))
    assert "run loaderdoctor check" in watched.fix
