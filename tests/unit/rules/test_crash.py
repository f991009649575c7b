"""worker-crash on hand-made Recordings: a crash is critical with its cause, a recovered death a warning; and how
deaths.py reads the OOM killer's count."""

from __future__ import annotations

import dataclasses

import pytest
from recordings import make_recording, make_worker_samples

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import Recording, WorkerDeath
from loaderdoctor.rules import diagnose
from loaderdoctor.rules.crash import worker_crash
from loaderdoctor.workers import deaths


def _crashed(death: WorkerDeath, **fields) -> Recording:
    fields.setdefault("outcome", "crashed")
    return make_recording(worker_deaths=[death], **fields)


def test_no_death_no_finding():
    assert worker_crash(make_recording()) is None


def test_a_segfault_names_the_signal_the_sample_and_the_memory_last_seen():
    death = WorkerDeath(0, 4, "DataLoader worker (pid 101) is killed by signal", pid=101, exitcode=-11, index=37)
    samples = make_worker_samples([101, 102], 2.0, uss_mb_at=lambda t: 100 + 50 * t)
    finding = worker_crash(_crashed(death, worker_samples=samples))
    assert finding is not None
    assert finding.severity == "critical"
    assert "SIGSEGV" in finding.title and "dataset[37]" in finding.title and "pid 101" in finding.title
    assert finding.evidence["signal"] == "SIGSEGV"
    assert finding.evidence["index"] == 37
    assert finding.evidence["uss_mb"] == 200.0  # the last sample of pid 101, at 2 s
    assert "on_sample_error" in finding.snippet


def test_the_memory_last_seen_is_the_last_round_that_read_it():
    death = WorkerDeath(0, 4, "DataLoader worker (pid 101) is killed by signal", pid=101, exitcode=-11, index=37)
    samples = make_worker_samples([101], 2.0, uss_mb_at=lambda t: 100 + 50 * t)
    edge = dataclasses.replace(samples[-1], t_s=2.1, uss_bytes=None, rss_bytes=512 * 2**20)  # a window's end
    finding = worker_crash(_crashed(death, worker_samples=[*samples, edge]))
    assert finding.evidence["uss_mb"] == 200.0 and finding.evidence["rss_mb"] == 512.0


def test_the_oom_killer_is_named_when_its_count_rose():
    death = WorkerDeath(1, 0, "killed", pid=7, exitcode=-9, index=3, oom_kill=True)
    finding = worker_crash(_crashed(death))
    assert "OOM killer ended it" in finding.title
    assert "memory" in finding.fix
    unknown = worker_crash(_crashed(WorkerDeath(1, 0, "killed", pid=7, exitcode=-9, oom_kill=None)))
    assert "SIGKILL" in unknown.title and "kill -9" in unknown.title


def test_a_worker_that_cannot_load_the_loader_under_spawn_gets_the_blocker_as_its_fix():
    death = WorkerDeath(0, 0, "exited unexpectedly", pid=5, exitcode=1)
    blocker = "the loader's dataset (NB) is defined in an interactive session (a notebook or the REPL): ..."
    rec = _crashed(death, start_method="spawn", forkserver_blocker=blocker, settings=Settings(num_workers=2))
    finding = worker_crash(rec)
    assert "workers started with spawn cannot load this loader" in finding.title
    assert finding.fix.startswith("The loader's dataset (NB) is defined in an interactive session")


def test_a_death_the_guard_recovered_from_is_a_warning_not_a_crash():
    death = WorkerDeath(0, 3, "killed", pid=9, exitcode=-11, index=12)
    finding = worker_crash(make_recording(worker_deaths=[death], outcome="completed"))
    assert finding.severity == "warning"
    assert "started again" in finding.title


def test_a_crash_after_the_guards_restarts_says_them_and_leads_a_loop_that_waited_on_them():
    from loaderdoctor.recording.record import BatchRecord, EpochRecord

    deaths = [WorkerDeath(0, 14, "killed", pid=pid, exitcode=-11, index=137) for pid in (9, 10, 11, 12)]
    steady = [BatchRecord(0, i, 0.001, 0.0, 0.04, 64, 8) for i in range(14)]
    restarts = [BatchRecord(0, 14 + i, 2.5, 0.0, 0.04, 64, 8, after_restart=True) for i in range(3)]
    epoch = EpochRecord(0, 0.05, 17, 8.2, [5, 6], "worker-died", restarts=3)
    rec = _crashed(deaths[0], settings=Settings(num_workers=2), batches=[*steady, *restarts], epochs=1)
    rec.worker_deaths, rec.epochs = deaths, [epoch]
    (main, *rest) = diagnose(rec)
    assert (main.rule, main.severity) == ("worker-crash", "critical")
    assert "after 3 restarts" in main.title and "dataset[137]" in main.title and "SIGSEGV" in main.title
    assert main.evidence["restarts"] == 3 and main.evidence["deaths"] == 4
    # 7.5 s of the loop's waiting was the restarts' (their workers starting again): not waiting on steady loading
    assert not [f for f in rest if f.rule == "input-bound"]


def test_a_worker_init_fn_error_is_critical_and_named_as_such():
    rec = make_recording(outcome="crashed", worker_init_error="ValueError: no config (at data.py:12 in init)")
    (main, *_) = diagnose(rec)
    assert main.rule == "worker-crash" and main.severity == "critical"
    assert "worker_init_fn" in main.title
    assert "data.py:12 in init" in main.fix


def test_a_crash_is_never_a_report_without_a_critical_finding():
    rec = _crashed(WorkerDeath(0, 0, "exited", pid=None, exitcode=None))
    assert any(f.severity == "critical" for f in diagnose(rec))


def test_a_fork_hazard_that_explains_a_death_leads_before_the_crash():
    from recordings import make_iterators

    death = WorkerDeath(0, 2, "killed", pid=3, exitcode=-9)
    rec = _crashed(death, iterators=make_iterators(2, threads=["metrics-uploader"]))
    rules = [f.rule for f in diagnose(rec)]
    assert rules[:2] == ["fork-unsafe", "worker-crash"]


def test_deaths_round_trip_through_json():
    death = WorkerDeath(0, 4, "m", pid=101, exitcode=-11, index=37, oom_kill=False)
    rec = make_recording(worker_deaths=[death], outcome="crashed", worker_init_error=None)
    again = Recording.from_dict(rec.to_dict())
    assert again.worker_deaths == [death]
    old = rec.to_dict()
    old["worker_deaths"] = [{"epoch": 0, "batch": 4, "message": "m"}]  # written before deaths had causes
    del old["worker_init_error"]
    assert Recording.from_dict(old).worker_deaths == [WorkerDeath(0, 4, "m")]


@pytest.mark.parametrize(("exitcode", "name"), [(-11, "SIGSEGV"), (-9, "SIGKILL"), (1, None), (0, None), (None, None)])
def test_signal_names(exitcode, name):
    assert deaths.signal_name(exitcode) == name


def test_the_oom_killer_count_is_read_from_cgroup_v2_or_v1(tmp_path, monkeypatch):
    monkeypatch.setattr(deaths, "_cgroup_paths", lambda: ("/job", "/job"))
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    assert deaths.oom_kills(tmp_path) == 2
    (tmp_path / "job" / "memory.events").unlink()
    (tmp_path / "memory" / "job").mkdir(parents=True)
    (tmp_path / "memory" / "job" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert deaths.oom_kills(tmp_path) == 5
    (tmp_path / "memory" / "job" / "memory.oom_control").unlink()
    assert deaths.oom_kills(tmp_path) is None
