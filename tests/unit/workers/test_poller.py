"""Worker stacks (faulthandler text, user frames, a thread's own stack) and worker samples, in this process."""

from __future__ import annotations

import collections
import faulthandler
import itertools
import os
import subprocess
import sys
import threading
import time
import typing

import psutil
import pytest
import torch
import torch.utils.data.dataloader

import loaderdoctor.loader.settings
from loaderdoctor.plain.usercode import is_user_frame
from loaderdoctor.recording.record import StackFrame, WorkerReading
from loaderdoctor.workers.poller import (
    WorkerPoller,
    dump_worker_stacks,
    machine_busy_cpu_s,
    parse_faulthandler,
    stuck_frame,
    thread_idle,
    thread_stack,
)

STDLIB_THREADING = threading.__file__
TORCH_FILE = torch.utils.data.dataloader.__file__
OWN_FILE = loaderdoctor.loader.settings.__file__
SCENARIO_FILE = os.path.join(os.path.dirname(loaderdoctor.__file__), "scenarios", "demo.py")

# What a stuck DataLoader worker writes on SIGUSR1: its pin/status threads first, the worker loop last.
WORKER_DUMP = f"""\
Thread 0x00007f3b2a7fc700 (most recent call first):
  File "{STDLIB_THREADING}", line 327 in wait
  File "{STDLIB_THREADING}", line 629 in wait
  File "{STDLIB_THREADING}", line 982 in run
  File "{STDLIB_THREADING}", line 1045 in _bootstrap_inner
  File "{STDLIB_THREADING}", line 1002 in _bootstrap

Current thread 0x00007f3b3c1f3740 (most recent call first):
  File "/tmp/user_pipeline/dataset.py", line 41 in _decode
  File "/tmp/user_pipeline/dataset.py", line 28 in __getitem__
  File "{OWN_FILE}", line 44 in __getitem__
  File "{TORCH_FILE}", line 52 in <listcomp>
  File "{TORCH_FILE}", line 308 in _worker_loop
  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run
  File "/usr/lib/python3.11/multiprocessing/process.py", line 314 in _bootstrap
"""


def test_parse_faulthandler_picks_the_worker_loop_thread():
    frames = parse_faulthandler(WORKER_DUMP)
    assert frames[0] == StackFrame("/tmp/user_pipeline/dataset.py", 41, "_decode")
    assert [f.function for f in frames] == [
        "_decode",
        "__getitem__",
        "__getitem__",
        "<listcomp>",
        "_worker_loop",
        "run",
        "_bootstrap",
    ]
    assert frames[4].line == 308


def test_parse_faulthandler_falls_back_to_the_first_thread():
    text = WORKER_DUMP.replace("_worker_loop", "main")
    assert parse_faulthandler(text)[0] == StackFrame(STDLIB_THREADING, 327, "wait")


def test_parse_faulthandler_of_nothing():
    assert parse_faulthandler("") == []
    assert parse_faulthandler('  File "/tmp/x.py", line 1 in f\n') == []  # a frame outside any thread header


def test_parse_faulthandler_on_a_real_dump(tmp_path):
    release = threading.Event()

    def load_sample() -> None:
        release.wait(10.0)

    def _worker_loop() -> None:
        load_sample()

    thread = threading.Thread(target=_worker_loop, name="fake-worker-loop")
    thread.start()
    try:
        with open(tmp_path / "dump.txt", "w+") as dump:
            faulthandler.dump_traceback(dump, all_threads=True)
            dump.seek(0)
            text = dump.read()
    finally:
        release.set()
        thread.join()
    frames = parse_faulthandler(text)
    loop = next(f for f in frames if f.function == "_worker_loop")
    assert loop.file == __file__
    # threading.py's wait frames are not the user's; the loop's caller (copied by fork in a worker) never counts
    stuck = stuck_frame(frames)
    assert stuck is not None and stuck.function == "load_sample" and stuck.file == __file__


def test_stuck_frame_ignores_the_frames_fork_copied_below_the_worker_loop():
    idle_worker = [
        StackFrame(STDLIB_THREADING, 327, "wait"),
        StackFrame("/venv/site-packages/torch/utils/data/_utils/worker.py", 300, "_worker_loop"),
        StackFrame("/home/u/train.py", 33, "main"),  # the parent's frame, copied by fork
    ]
    assert stuck_frame(idle_worker) is None


def test_user_frames():
    assert is_user_frame(StackFrame("/tmp/user_pipeline/dataset.py", 1, "f"))
    assert is_user_frame(StackFrame(SCENARIO_FILE, 1, "build"))
    assert is_user_frame(StackFrame(__file__, 1, "test"))


def test_frames_that_are_not_the_users():
    assert not is_user_frame(StackFrame(STDLIB_THREADING, 1, "wait"))
    assert not is_user_frame(StackFrame(typing.__file__, 1, "f"))
    assert not is_user_frame(StackFrame(TORCH_FILE, 1, "_worker_loop"))
    assert not is_user_frame(StackFrame(OWN_FILE, 1, "build"))
    assert not is_user_frame(StackFrame("<frozen importlib._bootstrap>", 1, "_load"))


def test_stuck_frame_is_the_innermost_user_frame():
    frames = parse_faulthandler(WORKER_DUMP)
    assert stuck_frame(frames) == StackFrame("/tmp/user_pipeline/dataset.py", 41, "_decode")
    only_library = [StackFrame(STDLIB_THREADING, 1, "wait"), StackFrame(TORCH_FILE, 2, "_worker_loop")]
    assert stuck_frame(only_library) is None
    assert stuck_frame([]) is None


def test_thread_stack_of_the_main_thread_from_another_thread():
    assert threading.current_thread() is threading.main_thread()
    seen = []
    reader = threading.Thread(target=lambda: seen.append(thread_stack(threading.main_thread())))
    reader.start()
    reader.join()
    stack = seen[0]
    assert stack.pid == os.getpid()
    assert stack.frames[0].file == STDLIB_THREADING  # innermost first: the main thread is in join()
    assert stack.stuck_frame.function == "test_thread_stack_of_the_main_thread_from_another_thread"
    assert stack.stuck_frame.file == __file__


def test_thread_stack_of_a_finished_thread_is_empty():
    done = threading.Thread(target=lambda: None)
    done.start()
    done.join()
    stack = thread_stack(done)
    assert stack.frames == []
    assert stack.stuck_frame is None


# WorkerPoller


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_sample_once_on_this_process():
    clock = FakeClock()
    poller = WorkerPoller(lambda: [os.getpid()], clock=clock)
    clock.now = 51.5
    poller.poll_once()
    (sample,) = poller.readings
    assert sample.pid == os.getpid()
    assert sample.t_s == 1.5
    assert sample.uss_bytes > 0
    assert sample.rss_bytes >= sample.uss_bytes
    assert sample.cpu_s > 0
    assert sample.threads >= 1


def test_sample_once_skips_a_pid_that_is_gone():
    poller = WorkerPoller(lambda: [2**22 + 12345], clock=FakeClock())  # above the largest pid Linux allows
    poller.poll_once()
    assert poller.readings == []


def test_rounds_that_cost_much_are_spaced_to_take_at_most_a_twentieth_of_a_core(monkeypatch):
    # A round reads each worker's USS, which costs this process the kernel's walk over the worker's pages: eight
    # workers holding 2 GB each took 0.24 s a round, a core at one round every 0.25 s.
    rounds = []

    def costly_round(self) -> None:
        rounds.append(time.monotonic())
        spent = time.thread_time() + 0.02
        while time.thread_time() < spent:
            pass

    monkeypatch.setattr(WorkerPoller, "poll_once", costly_round)
    poller = WorkerPoller(lambda: [], interval_s=0.01).start()
    time.sleep(1.5)
    poller.stop()
    # Unbounded: a round every 0.03 s, about 50. Bounded: 0.02 s of CPU, then 0.4 s of rest (5% of a core).
    assert 2 <= len(rounds) <= 6, rounds
    assert min(b - a for a, b in itertools.pairwise(rounds)) >= 0.35


def test_cheap_rounds_keep_their_interval(monkeypatch):
    rounds = []
    monkeypatch.setattr(WorkerPoller, "poll_once", lambda self: rounds.append(time.monotonic()))
    poller = WorkerPoller(lambda: [], interval_s=0.05).start()
    time.sleep(1.0)
    poller.stop()
    assert len(rounds) >= 10  # one every 0.05 s: 20 on a quiet machine


def _feed(poller: WorkerPoller, pid: int, cpu_at: list[tuple[float, float]]) -> None:
    for t_s, cpu_s in cpu_at:
        poller.readings.append(WorkerReading(t_s=t_s, pid=pid, uss_bytes=1, rss_bytes=1, cpu_s=cpu_s, threads=1))


def test_cpu_idle_on_hand_fed_samples():
    poller = WorkerPoller(lambda: [], clock=FakeClock())
    assert poller.cpu_idle([1], 2.0) is None  # no samples at all
    _feed(poller, 1, [(0.0, 0.0), (1.0, 0.5), (2.0, 1.0), (3.0, 1.02), (4.0, 1.04)])  # busy, then idle
    _feed(poller, 2, [(0.0, 0.0), (1.0, 0.3), (2.0, 0.6), (3.0, 0.9), (4.0, 1.2)])  # busy throughout
    assert poller.cpu_idle([1], 2.0) is True  # 0.04 CPU s in the last 2 s: 2% of a core, check's poller's
    assert poller.cpu_idle([1], 3.0) is False  # 0.54 CPU s in the last 3 s
    assert poller.cpu_idle([2], 2.0) is False
    assert poller.cpu_idle([1, 2], 2.0) is False
    assert poller.cpu_idle([1], 2.0, max_core_share=0.01) is False
    _feed(poller, 5, [(0.0, 0.0), (2.0, 0.09), (4.0, 0.3)])  # 4.5% of a core, then 10.5%
    assert poller.cpu_idle([5], 2.0) is False
    assert poller.cpu_idle([5], 4.0) is False  # 7.5% over the 4 s
    assert poller.cpu_idle([5], 1.0) is None  # one sample in the window: not watched long enough


def test_cpu_idle_is_unknown_when_not_watched_long_enough():
    poller = WorkerPoller(lambda: [], clock=FakeClock())
    _feed(poller, 1, [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (3.0, 0.0), (4.0, 0.0)])
    _feed(poller, 3, [(3.5, 0.0), (4.0, 0.0)])  # first seen 0.5 s ago
    assert poller.cpu_idle([1], 2.0) is True
    assert poller.cpu_idle([3], 2.0) is None
    assert poller.cpu_idle([1, 3], 2.0) is None
    assert poller.cpu_idle([4], 2.0) is None  # never sampled


def test_thread_idle_tells_a_busy_thread_from_a_blocked_one():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    busy = threading.Thread(target=spin)
    busy.start()
    try:
        assert thread_idle(busy, window_s=0.3) is False
    finally:
        stop.set()
        busy.join()
    blocked = threading.Thread(target=stop.wait)
    stop.clear()
    blocked.start()
    try:
        assert thread_idle(blocked, window_s=0.3) is True
    finally:
        stop.set()
        blocked.join()


_HOOKED_CHILD = """
import sys, time
from loaderdoctor.workers.poller import StackDumpHook
if sys.argv[2] == "hook":
    StackDumpHook(sys.argv[1])(0)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.workers
@pytest.mark.timeout(60)
@pytest.mark.parametrize("hooked", [True, False])
def test_only_a_worker_whose_hook_is_in_place_is_asked_for_its_stacks(tmp_path, hooked):
    # A spawned worker that is still importing (or dying of an import error) has no handler for the stack signal:
    # its default action would end it, and the crash would be told as "ended by SIGUSR1", its cause lost.
    child = subprocess.Popen(
        [sys.executable, "-c", _HOOKED_CHILD, str(tmp_path), "hook" if hooked else "none"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        (stack,) = dump_worker_stacks([child.pid], str(tmp_path), wait_s=5)
        time.sleep(0.2)
        assert child.poll() is None  # alive either way
        if hooked:
            assert any(frame.function == "<module>" for frame in stack.frames)
        else:
            assert stack.frames == []
    finally:
        child.kill()
        child.wait()


def test_the_machines_busy_time_leaves_out_a_virtual_machines_steal_and_its_guests(monkeypatch):
    # Steal is the hypervisor giving this machine's cores to others: no process here used that time, and counted
    # as busy it was other processes' load (0.1 to 0.6 cores beside a quiet check here, pairs of windows left out).
    fields = "user nice system idle iowait irq softirq steal guest guest_nice"
    times = collections.namedtuple("scputimes", fields)(
        user=10.0,
        nice=1.0,
        system=2.0,
        idle=50.0,
        iowait=3.0,
        irq=0.5,
        softirq=0.5,
        steal=7.0,
        guest=4.0,
        guest_nice=1.0,
    )
    monkeypatch.setattr(psutil, "cpu_times", lambda: times)
    assert machine_busy_cpu_s() == pytest.approx(10.0 + 1.0 + 2.0 + 0.5 + 0.5)  # the guests' is in user's


def test_a_round_of_the_cpu_only_reads_no_private_memory_resuming_takes_such_a_round_and_pausing_reads_it():
    clock = FakeClock()
    poller = WorkerPoller(lambda: [os.getpid()], clock=clock)
    poller.poll_once(private_memory=False)
    poller.pause()  # a window's end: the loop no longer waits, and growth gets its last reading
    poller.resume()
    assert len(poller.readings) == 3 and len(poller.host_readings) == 3
    first, paused, resumed = poller.readings
    assert first.uss_bytes is None and resumed.uss_bytes is None and paused.uss_bytes > 0
    assert all(sample.rss_bytes > 0 and sample.cpu_s > 0 for sample in poller.readings)
    poller.poll_once()
    assert poller.readings[-1].uss_bytes > 0
