"""The lifeline of the guard's workers (guard/lifeline.py): it tells the process it was made in from one that
ended or reused its pid, and its wait ends when that process does, by pidfd or, without one, by polling."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from loaderdoctor.guard import lifeline as lifeline_module
from loaderdoctor.guard.lifeline import Lifeline

pytestmark = [pytest.mark.timeout(60)]


def _watching(process: subprocess.Popen) -> Lifeline:
    """A lifeline to `process` instead of this one, as a worker holds one to the training process."""
    line = Lifeline()
    line.pid, line.started = process.pid, lifeline_module._start_time(process.pid)
    return line


def test_the_process_it_was_made_in_is_alive_and_holding_it_there_starts_nothing():
    line = Lifeline()
    assert line.alive()
    threads = threading.active_count()
    line.hold()  # in the training process itself (and in a forked worker, whose parent it is): torch watches
    assert threading.active_count() == threads


def test_a_pid_reused_by_another_process_is_not_the_training_process():
    line = Lifeline()
    line.started = (line.started or 0.0) - 1.0  # as if this pid had been another, earlier process's
    assert not line.alive()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
@pytest.mark.workers
def test_the_wait_ends_when_the_process_ends_even_unreaped(monkeypatch, pidfd):
    if pidfd and not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfd_open here")
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
        monkeypatch.setattr(lifeline_module, "_POLL_S", 0.05)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        line = _watching(process)
        assert line.alive()
        waiting = threading.Thread(target=line._wait, daemon=True)
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive()  # it waits while the process runs
        process.kill()
        waiting.join(20)  # the killed process is a zombie until reaped below: gone all the same
        assert not waiting.is_alive()
        assert not line.alive()
    finally:
        process.kill()
        process.wait()
