"""tap/deathwatch.py: a followed loader's worker that ends other than cleanly is told, with its exit status and the
index it held, before torch's handler runs; a stop signal's end waits for this process to get the same signal (then
it is the job's stop: nothing told, torch's handler never called), else it is a death like another."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from loaderdoctor.tap import deathwatch, signals
from loaderdoctor.workers import processes

pytestmark = [pytest.mark.workers, pytest.mark.timeout(60)]


def _child(code: str) -> subprocess.Popen:
    """A child process that ends as `code` makes it (left unreaped until the test waits on it)."""
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 20
    while deathwatch.exit_status(child.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return child


@pytest.fixture
def followed(monkeypatch):
    """A followed loader of `workers` (children), what was told of them, and what torch's handler was called for."""
    monkeypatch.setattr(signals, "_stops", {})
    monkeypatch.setattr(processes, "_killed", set())
    state = SimpleNamespace(workers=[], shutdown=False, told=[], torch_called=0, children=[])
    iterator = SimpleNamespace(_workers=state.workers)
    follower = deathwatch.follow(
        lambda: SimpleNamespace(_workers=iterator._workers, _shutdown=state.shutdown),
        lambda worker_id: 100 + worker_id,
        state.told.append,
    )

    def torch_handler(signum, frame):
        state.torch_called += 1

    state.sigchld = lambda: deathwatch._on_sigchld(signal.SIGCHLD, None, torch_handler)
    yield state
    deathwatch.unfollow(follower)
    for child in state.children:
        child.wait(timeout=20)


def _add(state, code: str) -> subprocess.Popen:
    child = _child(code)
    state.children.append(child)
    state.workers.append(SimpleNamespace(pid=child.pid))
    return child


def test_a_worker_killed_by_a_signal_is_told_with_the_index_it_held_and_torchs_handler_runs(followed):
    _add(followed, "pass")  # worker 0 ends cleanly: nothing to tell
    child = _add(followed, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    followed.sigchld()
    assert [(end.pid, end.worker_id, end.exitcode, end.index) for end in followed.told] == [
        (child.pid, 1, -signal.SIGSEGV, 101)
    ]
    assert followed.torch_called == 1
    followed.sigchld()  # told once
    assert len(followed.told) == 1
    assert deathwatch.exit_status(child.pid) == -signal.SIGSEGV  # still there for torch and multiprocessing


def test_an_exit_status_is_told_and_the_ends_torch_or_loaderdoctor_caused_are_not(followed):
    exited = _add(followed, "import os; os._exit(3)")
    killed = _add(followed, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    processes.note_killed([killed.pid])  # a stall's: loaderdoctor ended it
    followed.sigchld()
    assert [(end.pid, end.exitcode) for end in followed.told] == [(exited.pid, 3)]
    followed.told.clear()
    followed.shutdown = True  # torch ends the workers itself (its terminate() of one that would not end)
    _add(followed, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    followed.sigchld()
    assert followed.told == []


def test_a_worker_stopped_with_this_process_is_no_death_and_torchs_handler_is_not_called(followed):
    _add(followed, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    signals.note_stop(signal.SIGTERM)  # the scheduler's SIGTERM reached this process too
    followed.sigchld()
    assert followed.told == [] and followed.torch_called == 0


def test_a_stop_signals_end_waits_for_the_grace_then_is_a_death_when_this_process_never_got_it(followed, monkeypatch):
    monkeypatch.setattr(deathwatch, "STOP_GRACE_S", 0.2)
    child = _add(followed, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    followed.sigchld()
    assert followed.told == [] and followed.torch_called == 0  # held: it may be the job's stop
    deadline = time.monotonic() + 10
    while not followed.told and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [(end.pid, end.exitcode) for end in followed.told] == [(child.pid, -signal.SIGTERM)]
    followed.sigchld()
    assert followed.torch_called == 1  # no longer held


def test_a_stop_that_comes_within_the_grace_makes_the_held_end_the_jobs(followed, monkeypatch):
    monkeypatch.setattr(deathwatch, "STOP_GRACE_S", 0.2)
    _add(followed, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    followed.sigchld()
    signals.note_stop(signal.SIGTERM)  # this process's own SIGTERM, a moment later
    time.sleep(0.5)
    followed.sigchld()
    assert followed.told == [] and followed.torch_called == 0


def test_the_handler_goes_over_torchs_while_followed_and_is_put_back_after(monkeypatch):
    before = signal.getsignal(signal.SIGCHLD)
    torch_handler = lambda signum, frame: None  # noqa: E731
    signal.signal(signal.SIGCHLD, torch_handler)
    try:
        follower = deathwatch.follow(lambda: None, lambda worker_id: None, lambda end: None)
        deathwatch.workers_started()
        assert signal.getsignal(signal.SIGCHLD) is not torch_handler
        deathwatch.unfollow(follower)
        assert signal.getsignal(signal.SIGCHLD) is torch_handler
    finally:
        signal.signal(signal.SIGCHLD, before)
