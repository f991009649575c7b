"""A guarded worker whose parent is not the training process (a forkserver's child) ends when that process dies.

torch's worker loop ends itself when its parent dies: it compares os.getppid() with the parent it started
under. A forked or spawned worker's parent is the training process, so that is enough. A forkserver's worker's
parent is the fork server, and the fork server ends only when every holder of its "alive" pipe has closed it:
Python hands that pipe to each of its workers, so after a SIGKILL of the training process the workers keep the
fork server alive, the fork server keeps them thinking their parent lives, and both (with the resource tracker,
whose pipe they hold too) run forever. Such a worker watches the training process itself: a thread that waits
on a pidfd (Linux 5.3+), or elsewhere polls the pid, and ends the worker the moment it is gone. With the
workers gone the fork server and the resource tracker see their pipes close and end by themselves.
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time

import psutil

_POLL_S = 0.5  # where no pidfd can be waited on: how often the pid is looked at
_GONE_EXIT_CODE = 1
_LINUX = sys.platform.startswith("linux")
# How far apart two readings of one process's start time may be: psutil's seconds come from a clock that may drift.
_SAME_START = 0.0 if _LINUX else 1.0


def _start_time(pid: int) -> float | None:
    """When process `pid` started, or None when there is no such process or it has exited (a zombie): with the
    pid, it names one process, never a later one that reused the pid. On Linux the kernel's clock ticks, exact;
    elsewhere psutil's seconds."""
    if _LINUX:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            return None if fields[0] in (b"Z", b"X") else float(fields[19])
        except (OSError, IndexError, ValueError):
            return None
    try:
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
    except psutil.Error:
        return None


class Lifeline:
    """Made in the training process and pickled into each of its workers: hold() there ties the worker's life to
    the training process's."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.started = _start_time(self.pid)

    def hold(self) -> None:
        """In a worker: when its parent is not the training process (torch's own watchdog watches the parent),
        start the thread that ends this worker once the training process is gone."""
        if self.started is None or os.getpid() == self.pid or os.getppid() == self.pid:
            return
        threading.Thread(target=self._watch, name="loaderdoctor-lifeline", daemon=True).start()

    def alive(self) -> bool:
        """Whether the training process this lifeline was made in still runs."""
        started = _start_time(self.pid)
        return started is not None and self.started is not None and abs(started - self.started) <= _SAME_START

    def _watch(self) -> None:
        self._wait()
        os._exit(_GONE_EXIT_CODE)  # nothing is left to deliver to, nor to clean up for

    def _wait(self) -> None:
        """Return once the training process is gone."""
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                fd = pidfd_open(self.pid)
            except ProcessLookupError:
                return
            except OSError:
                fd = None  # an old kernel, or not allowed: poll instead
            if fd is not None:
                # The pidfd names the process found now: if the pid was reused before, the start time differs;
                # if after, the pidfd's own process has ended and the wait returns at once.
                if self.alive():
                    waiter = select.poll()  # not select(): a worker's descriptors may pass FD_SETSIZE
                    waiter.register(fd, select.POLLIN)
                    waiter.poll()
                os.close(fd)
                return
        while self.alive():
            time.sleep(_POLL_S)
