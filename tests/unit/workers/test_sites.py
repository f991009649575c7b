"""The site profiler on a real thread: wall and CPU time given to the site where the thread was (a lock waited
on with the CPU idle, a loop computing), written to its file and read back, and workers' activities joined."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from recordings import make_activity, make_recording

from loaderdoctor.recording.record import Recording
from loaderdoctor.workers.activity import LockCalls, WorkerActivity, WorkerSite, join_activities
from loaderdoctor.workers.sites import SiteProfiler, activity_path, read_worker_activity, thread_cpu_clock

WAIT_S = 10.0
LOCK_SAMPLES = 30


def _wait_then_compute(lock: threading.Lock, computed: threading.Event) -> None:
    lock.acquire()  # blocks until the test has seen enough samples here
    lock.release()
    spent = time.thread_time() + 0.3
    value = 0.0
    while time.thread_time() < spent:
        value = (value * 1.000001 + 1.0) % 1e6
    computed.set()


def _site(activity: WorkerActivity, function: str, lock: str | None) -> WorkerSite | None:
    return next((s for s in activity.sites if s.function == function and s.lock == lock), None)


def test_time_goes_to_the_site_where_the_thread_was(tmp_path):
    lock = threading.Lock()
    lock.acquire()
    computed = threading.Event()
    thread = threading.Thread(target=_wait_then_compute, args=(lock, computed), daemon=True)
    thread.start()
    ident = thread.ident or 0
    profiler = SiteProfiler(activity_path(str(tmp_path), 1), ident, thread_cpu_clock(ident) or 0).start()
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            waited = _site(profiler.activity(), "_wait_then_compute", "threading.Lock.acquire")
            if waited is not None and waited.samples >= LOCK_SAMPLES:
                break
            time.sleep(0.02)
        lock.release()
        assert computed.wait(WAIT_S)
        thread.join(WAIT_S)
    finally:
        profiler.stop()
    activity = read_worker_activity(str(tmp_path))  # stop() wrote the totals
    assert activity is not None
    waited = _site(activity, "_wait_then_compute", "threading.Lock.acquire")
    computing = [s for s in activity.sites if s.function == "_wait_then_compute" and s.lock is None]
    assert waited is not None and waited.samples >= LOCK_SAMPLES
    assert waited.cpu_s < 0.2 * waited.wall_s  # blocked: the CPU idle
    assert sum(s.cpu_s for s in computing) >= 0.1  # the 0.3 s of CPU spent computing, most of it seen there
    assert activity.workers == 1 and activity.idle_s == 0.0  # no worker loop here: never idle for work
    assert activity.sampled_s >= sum(s.wall_s for s in activity.sites) - 1e-9


def _activity(wall_s: float, lock_calls: LockCalls, *sites: WorkerSite) -> WorkerActivity:
    return WorkerActivity(1, wall_s, 0.5, 0.1, 100, list(sites), lock_calls)


def test_workers_are_joined_site_by_site():
    flock = WorkerSite("/data/poses.py", 12, "__getitem__", "fcntl.flock", 3.0, 0.1, 300)
    sleep = WorkerSite("/data/poses.py", 14, "__getitem__", None, 1.0, 0.05, 100)
    joined = join_activities(
        [
            _activity(4.0, LockCalls(read_only_exclusive=10), flock, sleep),
            _activity(5.0, LockCalls(read_only_exclusive=12, writable=1), flock),
        ]
    )
    assert joined == WorkerActivity(
        workers=2,
        sampled_s=9.0,
        idle_s=1.0,
        cpu_s=0.2,
        samples=200,
        sites=[
            WorkerSite("/data/poses.py", 12, "__getitem__", "fcntl.flock", 6.0, 0.2, 600, workers=2),
            sleep,
        ],
        lock_calls=LockCalls(read_only_exclusive=22, writable=1),
    )
    assert flock.wall_s == 3.0  # the parts are left as they were
    assert join_activities([]) is None


def test_what_a_worker_wrote_reads_back_whole(tmp_path):
    site = WorkerSite("/data/poses.py", 12, "__getitem__", "fcntl.flock", 3.0, 0.1, 300)
    for pid in (101, 102):
        path = activity_path(str(tmp_path), pid)
        Path(path).write_text(json.dumps(_activity(4.0, LockCalls(), site).to_dict()))
    (tmp_path / "103.activity.json").write_text('{"workers": 1')  # cut short: left out
    activity = read_worker_activity(str(tmp_path))
    assert activity is not None and activity.workers == 2
    assert activity.sites == [WorkerSite("/data/poses.py", 12, "__getitem__", "fcntl.flock", 6.0, 0.2, 600, 2)]


def test_a_recording_keeps_its_activity_through_json():
    """As a rank of `scale` sends its Recording to the launcher."""
    rec = make_recording(worker_activity=make_activity())
    again = Recording.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert again.worker_activity == rec.worker_activity
