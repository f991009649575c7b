"""A worker caught as it ends: workers/deaths.worker_death waits for its exit status; workers/poller leaves out
a sample read after its memory was given back."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

from loaderdoctor.workers.deaths import signal_name, worker_death


class _Exiting:
    """A worker whose pipe has closed (its end is seen) while the kernel has no exit status for it yet: it has one
    once joined, as a process that is still exiting does."""

    def __init__(self, pid: int, sentinel: int) -> None:
        self.pid = pid
        self.sentinel = sentinel
        self.exitcode: int | None = None
        self.joined: list[float | None] = []

    def join(self, timeout: float | None = None) -> None:
        self.joined.append(timeout)
        self.exitcode = -signal.SIGSEGV


def test_a_worker_seen_ending_before_its_exit_status_is_there_is_waited_for():
    ended, writer = os.pipe()
    os.close(writer)  # the dying worker's end of its pipe: closed, so the sentinel is ready
    alive, alive_writer = os.pipe()
    try:
        dying, living = _Exiting(101, ended), _Exiting(102, alive)
        iterator = SimpleNamespace(_workers=[living, dying])
        death = worker_death(iterator, epoch=0, batch=4, error=RuntimeError("worker exited"), held=lambda i: 37)
    finally:
        for descriptor in (ended, alive, alive_writer):
            os.close(descriptor)
    assert (death.pid, death.index, signal_name(death.exitcode)) == (101, 37, "SIGSEGV")
    assert dying.joined and not living.joined


class _ExitingProcess:
    """A psutil.Process of a worker caught as it exits: it answers, but its memory is already given back."""

    pid = 4242

    def oneshot(self):
        import contextlib

        return contextlib.nullcontext()

    def memory_full_info(self):
        return SimpleNamespace(uss=0, rss=0)

    def cpu_times(self):
        return SimpleNamespace(user=1.0, system=0.1)

    def num_threads(self):
        return 1


def test_a_worker_sampled_as_it_exits_is_no_sample():
    """Read between its memory's release and its end, a worker shows 0 bytes: "up to 0 MB private memory each"."""
    from loaderdoctor.workers.poller import WorkerPoller

    poller = WorkerPoller(lambda: [_ExitingProcess.pid])
    poller._processes[_ExitingProcess.pid] = _ExitingProcess()  # type: ignore[assignment]
    poller.poll_once()
    assert poller.readings == []
