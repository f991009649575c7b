"""prescribe() combines the findings' changes, and keeps workers off fork only where forking is hazardous."""

from __future__ import annotations

import pytest
from recordings import make_iterators, make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.report import Finding
from loaderdoctor.rules.prescribe import prescribe

IN_MAIN_PROCESS = Settings()
MORE_WORKERS = {"num_workers": 2, "persistent_workers": True}
TWO_WORKERS = Settings(num_workers=2)


def _finding(rule: str = "input-bound", severity: str = "critical", **change) -> Finding:
    return Finding(rule=rule, severity=severity, title=rule, evidence={}, fix="", settings_change=change)


@pytest.fixture
def fork_by_default(monkeypatch):
    monkeypatch.setattr("loaderdoctor.loader.settings.default_start_method", lambda: "fork")


# prescribe


def test_prescribe_applies_every_change():
    rec = make_recording(settings=IN_MAIN_PROCESS)
    findings = [_finding(**MORE_WORKERS), _finding("pin-memory", "warning", pin_memory=True)]
    assert prescribe(rec, findings) == Settings(num_workers=2, persistent_workers=True, pin_memory=True)


def test_the_main_diagnosis_wins_a_conflict():
    rec = make_recording(settings=IN_MAIN_PROCESS)
    findings = [
        _finding("worker-respawn", "critical", num_workers=4),
        _finding("cpu-oversubscription", "warning", num_workers=1, prefetch_factor=4),
    ]
    assert prescribe(rec, findings) == Settings(num_workers=4, prefetch_factor=4)


def test_info_findings_are_ignored():
    rec = make_recording(settings=IN_MAIN_PROCESS)
    assert prescribe(rec, [_finding("pin-memory", "info", pin_memory=True)]) is None
    findings = [_finding("pin-memory", "info", num_workers=8), _finding("input-bound", "warning", num_workers=2)]
    assert prescribe(rec, findings) == Settings(num_workers=2)


def test_none_when_nothing_changes():
    rec = make_recording(settings=Settings(num_workers=2, persistent_workers=True))
    assert prescribe(rec, []) is None
    assert prescribe(rec, [_finding("stall", "critical")]) is None  # a finding without a settings change
    assert prescribe(rec, [_finding(persistent_workers=True)]) is None  # already so


def test_none_when_the_change_is_dropped_as_invalid():
    rec = make_recording(settings=IN_MAIN_PROCESS)
    assert prescribe(rec, [_finding(persistent_workers=True)]) is None  # needs workers: dropped at 0


def test_adding_fork_workers_after_thread_hazards_switches_to_forkserver(fork_by_default):
    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(2, None, threads=["prefetcher"]))
    assert prescribe(rec, [_finding(**MORE_WORKERS)]) == Settings(
        num_workers=2, persistent_workers=True, start_method="forkserver"
    )


def test_adding_fork_workers_after_cuda_switches_to_forkserver(fork_by_default):
    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(1, None, cuda_initialized=True))
    assert prescribe(rec, [_finding(num_workers=3)]) == Settings(
        num_workers=3, persistent_workers=True, start_method="forkserver"
    )


def test_adding_fork_workers_without_hazards_keeps_the_default(fork_by_default):
    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(2, None))
    assert prescribe(rec, [_finding(**MORE_WORKERS)]) == Settings(num_workers=2, persistent_workers=True)


def test_an_explicit_spawn_is_kept_despite_hazards(fork_by_default):
    rec = make_recording(
        settings=Settings(num_workers=1, start_method="spawn"),
        start_method="spawn",
        iterators=make_iterators(2, "spawn", threads=["t1"]),
    )
    assert prescribe(rec, [_finding(num_workers=2)]) == Settings(num_workers=2, start_method="spawn")


def test_adding_fork_workers_keeps_fork_where_forkserver_cannot_load_the_loader(fork_by_default):
    rec = make_recording(
        settings=IN_MAIN_PROCESS,
        iterators=make_iterators(2, None, threads=["tqdm_monitor"]),
        forkserver_blocker="the loader's collate_fn (function) cannot be pickled",
    )
    assert prescribe(rec, [_finding(**MORE_WORKERS)]) == Settings(num_workers=2, persistent_workers=True)


def test_importing_inductor_is_no_reason_to_leave_fork(fork_by_default):
    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(2, None))  # no thread, no compile
    assert prescribe(rec, [_finding(**MORE_WORKERS)]).start_method is None


def test_a_start_method_changed_for_new_workers_is_named_by_a_finding(fork_by_default):
    # Issue 49's text pipeline: no workers, the fix adds some, and it became forkserver with no word of why.
    from loaderdoctor.rules.safety import fork_unsafe

    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(2, None, threads=["prefetcher"]))
    finding = fork_unsafe(rec)
    assert finding is not None and finding.severity == "info" and finding.settings_change == {}
    assert finding.title == "Workers forked here would start while 1 other thread ran (prefetcher)"
    assert "a fix that adds workers starts them with forkserver" in finding.fix
    assert prescribe(rec, [_finding(**MORE_WORKERS), finding]).start_method == "forkserver"
    quiet = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(2, None))
    assert fork_unsafe(quiet) is None and prescribe(quiet, [_finding(**MORE_WORKERS)]).start_method is None


def test_tqdms_monitor_is_no_reason_to_leave_fork(fork_by_default):
    # `datasets` draws a tqdm bar as it maps, which starts tqdm's monitor thread: it holds only tqdm's own lock.
    import dataclasses

    from loaderdoctor.host.forkhazards import AliveThread
    from loaderdoctor.rules.safety import fork_unsafe

    monitor = AliveThread("tqdm_monitor", "tqdm/_monitor.py:62 in TMonitor.run", "tqdm")
    iterators = [dataclasses.replace(it, threads=[monitor]) for it in make_iterators(2, None)]
    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=iterators)
    assert fork_unsafe(rec) is None
    assert prescribe(rec, [_finding(**MORE_WORKERS)]) == Settings(num_workers=2, persistent_workers=True)
    users = AliveThread("tqdm_monitor", "train.py:12 in run")  # a thread of the user's own, named alike
    rec = make_recording(
        settings=IN_MAIN_PROCESS,
        iterators=[dataclasses.replace(it, threads=[users]) for it in make_iterators(2, None)],
    )
    assert prescribe(rec, [_finding(**MORE_WORKERS)]).start_method == "forkserver"
