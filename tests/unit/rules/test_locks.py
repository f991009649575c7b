"""lock-contention on hand-made Recordings: the line, the lock and its cost with exact figures, what may be
removed and what guards writes, the lines below which it stays quiet, and its place before input-bound."""

from __future__ import annotations

import pytest
from recordings import POSES, make_activity, make_iterators, make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import Stall
from loaderdoctor.rules import diagnose
from loaderdoctor.rules.locks import SHARED_LOCK_SNIPPET, lock_contention, lock_free_provable
from loaderdoctor.workers.activity import LockCalls

FOUR_WORKERS = Settings(num_workers=4, persistent_workers=True)


def locked_recording(*, wait_s: float = 0.05, step_s: float | None = 0.015, **activity: object):
    """4 workers waiting, not computing, while the step (15 ms) waits 50 ms per batch: 77% of the time."""
    return make_recording(
        settings=FOUR_WORKERS,
        wait_s=wait_s,
        step_s=step_s,
        cpu_share=0.02,
        worker_activity=make_activity(**activity),  # type: ignore[arg-type]
    )


def test_an_exclusive_lock_on_read_only_files_is_named_with_its_line_and_its_cost():
    finding = lock_contention(locked_recording())
    assert finding.rule == "lock-contention"
    assert finding.severity == "critical"
    assert finding.title == f"Workers wait on fcntl.flock 72% of their time, at {POSES}:57 in __getitem__"
    assert finding.evidence == {
        "site": f"{POSES}:57 in __getitem__",
        "lock": "fcntl.flock",
        "waiting_share": 0.72,  # (7.3 - 0.1) s of the 10.0 s the workers had work
        "site_cpu_share": 0.014,
        "worker_processes": 4,
        "workers_idle_share": 0.048,
        "wait_fraction": 0.769,
        "estimated_run_share": 0.554,  # 0.769 x 0.72
        "read_only_lock_calls": 680,
        "exclusive_read_only_lock_calls": 680,
        "writable_lock_calls": 0,
    }
    assert finding.fix.startswith(
        "fcntl.flock takes an exclusive lock (LOCK_EX) on files opened read-only (680 calls): one worker reads "
        "at a time"
    )
    assert "remove it" in finding.fix and "LOCK_SH" in finding.fix
    assert finding.snippet == SHARED_LOCK_SNIPPET
    assert finding.settings_change == {}
    assert finding.impact == pytest.approx(0.05 / 0.065 * 0.72)
    assert lock_free_provable(locked_recording().worker_activity)


def test_the_lock_is_the_main_diagnosis_before_the_wait_it_causes():
    findings = diagnose(locked_recording())
    assert [f.rule for f in findings] == ["lock-contention", "input-bound"]
    assert {f.severity for f in findings} == {"critical"}


def test_a_lock_on_files_opened_for_writing_guards_writes_and_must_stay():
    rec = locked_recording(lock_calls=LockCalls(writable=300))
    finding = lock_contention(rec)
    assert "it guards writes, do not remove it" in finding.fix
    assert "read-only" not in finding.fix
    assert finding.snippet is None
    assert finding.evidence["writable_lock_calls"] == 300
    assert not lock_free_provable(rec.worker_activity)  # nothing a lock-free run may make a no-op


def test_locks_on_both_kinds_of_file_say_which_may_go():
    finding = lock_contention(locked_recording(lock_calls=LockCalls(read_only_exclusive=40, writable=3)))
    assert finding.fix.startswith("The workers lock files opened for writing (3 calls): the lock guards writes")
    assert "On the files opened read-only (40 calls), a shared lock (LOCK_SH) or none" in finding.fix


def test_a_shared_lock_that_still_waits_points_at_the_holder_of_an_exclusive_one():
    finding = lock_contention(locked_recording(lock_calls=LockCalls(read_only_shared=500)))
    assert finding.fix.startswith("The workers take a shared lock (LOCK_SH) on files opened read-only and still wait")
    assert "lslocks" in finding.fix


def test_a_lock_between_threads_or_processes_has_no_file_lock_evidence():
    rec = locked_recording(lock="multiprocessing.Lock.__enter__", lock_calls=LockCalls())
    finding = lock_contention(rec)
    assert finding.title.startswith("Workers wait on multiprocessing.Lock.__enter__ 72% of their time")
    assert "read_only_lock_calls" not in finding.evidence
    assert finding.fix.startswith("multiprocessing.Lock.__enter__ is shared by the workers")
    assert not lock_free_provable(rec.worker_activity)


def test_sqlites_busy_wait_gets_read_only_connections():
    finding = lock_contention(locked_recording(lock="sqlite3.Connection.execute", lock_calls=LockCalls()))
    assert "mode=ro" in finding.fix and "busy wait" in finding.fix


@pytest.mark.parametrize(
    ("changes", "severity"),
    [
        ({}, "critical"),
        ({"lock_samples": 19}, None),  # seen too rarely to say
        ({"lock_wall_s": 1.09}, None),  # waiting 9.9% of the busy time
        ({"lock_wall_s": 1.11}, "warning"),  # 10.1%, costing 7.8% of the run
        ({"wait_s": 0.0008, "lock_wall_s": 7.3}, None),  # the loop waits 5%: the lock costs it 3.6%
    ],
)
def test_lock_contention_lines(changes, severity):
    finding = lock_contention(locked_recording(**changes))
    assert (finding and finding.severity) == severity


def test_time_idle_for_work_is_left_out_of_the_share():
    """Workers that keep up wait in torch's loop most of the time; their lock still costs each sample."""
    finding = lock_contention(locked_recording(sampled_s=30.5, idle_s=20.5))
    assert finding.evidence["waiting_share"] == 0.72
    assert finding.evidence["workers_idle_share"] == 0.672


def test_without_a_training_step_the_loop_only_loads():
    finding = lock_contention(locked_recording(step_s=None))
    assert finding.evidence["wait_fraction"] is None
    assert finding.evidence["estimated_run_share"] == 0.72


def test_quiet_without_activity_a_measured_wait_or_in_a_lock_free_run():
    assert lock_contention(make_recording(settings=FOUR_WORKERS)) is None  # no worker activity recorded
    assert lock_contention(locked_recording(lock_free=True)) is None
    stalled = locked_recording()
    stalled.batches = stalled.batches[:1]  # no steady batch: what the lock costs the loop is unknown
    assert lock_contention(stalled) is None
    assert lock_contention(locked_recording(lock=None)) is None  # the same time at a line that takes no lock


def test_workers_forked_while_a_thread_ran_and_stuck_on_a_lock_are_fork_unsafe_not_lock_contention():
    rec = make_recording(
        settings=FOUR_WORKERS,
        wait_s=0.05,
        step_s=0.015,
        cpu_share=0.02,
        worker_activity=make_activity(lock="threading.Lock.acquire"),
        iterators=make_iterators(2, "fork", threads=["log-flusher"]),
        stall=Stall(epoch=1, batch=3, waited_s=10.0, threshold_s=10.0, reason="no batch", workers_cpu_idle=True),
    )
    rules = [f.rule for f in diagnose(rec)]
    assert "lock-contention" not in rules
    assert rules[0] == "fork-unsafe"
    unstuck = make_recording(
        settings=FOUR_WORKERS,
        wait_s=0.05,
        step_s=0.015,
        cpu_share=0.02,
        worker_activity=make_activity(lock="threading.Lock.acquire"),
        iterators=make_iterators(2, "fork", threads=["log-flusher"]),
    )
    assert lock_contention(unstuck) is not None  # without a stall the lock's cost stands on its own
