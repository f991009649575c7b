"""Worker deaths told as they happen, from the workers themselves: a SIGCHLD handler over torch's reads, for each
followed loader, which of its current workers ended and how (its exit status or signal, read with waitid's WNOWAIT,
so that torch and multiprocessing still find it), and the dataset index it held, before torch's own handler raises
the death wherever the main thread is (the user's backward, an optimizer's step, the tap). Where torch raises it
no longer matters: the watch has the death.

A worker that a stop signal ended (SIGTERM, Ctrl-C...: see tap/signals.py) is held back from torch's handler for
STOP_GRACE_S: when this process gets the same signal (a scheduler's SIGTERM goes to the whole process group), the
worker was stopped with the job, and torch never calls it a crash; otherwise it is a death like another, and torch's
handler runs (the signal sent again). While this process stops, torch's handler is not called at all: a death it
would raise would cut the program's clean-up and loaderdoctor's summary short ("Exception ignored in ... __del__").
Workers that loaderdoctor itself killed (a stall's) are no death here. Installed (from the main thread) while
some loader is followed and its workers live, over torch's handler (which torch sets at its first worker start),
and put back when the last follower leaves."""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loaderdoctor.tap.signals import STOP_SIGNALS, TemporaryHandler, in_main_thread, recent_stop, stopped_with_job
from loaderdoctor.workers.processes import killed_by_loaderdoctor

# How long a worker that a stop signal ended waits for this process to get the same one before it is a death.
STOP_GRACE_S = 1.0


@dataclass(frozen=True)
class WorkerEnd:
    """A worker that ended other than cleanly, as the handler saw it."""

    pid: int
    worker_id: int
    exitcode: int  # as multiprocessing says it: -N when signal N ended it
    index: int | None  # the dataset index it was loading, when known
    at: float  # when it was seen ended (time.monotonic())

    @property
    def signum(self) -> int | None:
        return -self.exitcode if self.exitcode < 0 else None


@dataclass(eq=False)
class Follower:
    """One loader followed: torch's iterator now, the index a worker holds, and who is told of a death (called in
    the main thread from the handler, or from the grace's thread: it must only note it)."""

    torch_iterator: Callable[[], Any]
    held: Callable[[int], int | None]
    told: Callable[[WorkerEnd], None]


_followers: list[Follower] = []
_seen: set[int] = set()  # pids whose end was told (or found to be a stop's): each is told once
_waiting: list[tuple[Follower, WorkerEnd]] = []  # ended by a stop signal, within the grace
_lock = _thread.RLock()  # held for a moment by the main thread (its handler may run inside) or the grace's thread


def follow(
    torch_iterator: Callable[[], Any], held: Callable[[int], int | None], told: Callable[[WorkerEnd], None]
) -> Follower:
    """Follow a loader's workers until unfollow(): `told` hears of each one that ends other than cleanly."""
    follower = Follower(torch_iterator, held, told)
    _followers.append(follower)
    return follower


def workers_started() -> None:
    """A followed loader started workers (torch's handler is in place then): ours over it, from the main thread."""
    if _followers and not _handler.installed and in_main_thread():
        _handler.install()


def unfollow(follower: Follower) -> None:
    """Follow `follower` no more; with the last one, the handler is put back (from the main thread)."""
    if follower in _followers:
        _followers.remove(follower)
    if not _followers:
        _handler.uninstall()
        with _lock:
            _seen.clear()
            _waiting.clear()


def exit_status(pid: int) -> int | None:
    """How child `pid` ended, as multiprocessing says it (-N for signal N), seen without reaping it (waitid with
    WNOWAIT, as torch looks); None while it runs, or when it is no child of this process or was reaped."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return None
    if info is None or info.si_pid == 0:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return info.si_status


def ended_with_job(exitcode: int | None, at: float | None = None) -> bool:
    """Whether a worker that ended so (at `at`, time.monotonic(); now by default) was stopped with this process: by
    the stop signal it got too (a scheduler's SIGTERM to the whole process group), cleanly while this process got a
    stop signal (torch's workers catch Ctrl-C's KeyboardInterrupt and exit with status 0; torch's own SIGTERM handler
    exits 0 when the parent sent it), or with status 1 on Ctrl-C (a worker still starting: multiprocessing prints its
    KeyboardInterrupt and exits 1)."""
    if exitcode is not None and exitcode < 0:
        return stopped_with_job(-exitcode, at)
    if exitcode == 1:
        return stopped_with_job(signal.SIGINT, at)
    return exitcode == 0 and recent_stop(at)


def _look(now: float) -> None:
    """Tell (or hold for the grace) every followed worker that ended other than cleanly since the last look."""
    for follower in list(_followers):
        try:
            iterator = follower.torch_iterator()
        except Exception:  # a loader half made or torn down: nothing to read
            continue
        if iterator is None or getattr(iterator, "_shutdown", False):  # torch ends its workers itself
            continue
        for worker_id, worker in enumerate(list(getattr(iterator, "_workers", None) or ())):
            pid = getattr(worker, "pid", None)
            if pid is None or pid in _seen:
                continue
            exitcode = exit_status(pid)
            if not exitcode:
                continue
            _seen.add(pid)
            if killed_by_loaderdoctor(pid):
                continue
            end = WorkerEnd(pid, worker_id, exitcode, _held(follower, worker_id), now)
            if end.signum in STOP_SIGNALS:
                if not stopped_with_job(end.signum, now):
                    _waiting.append((follower, end))
                    _thread.start_new_thread(_after_grace, ())
                continue  # the job's stop (or maybe): no death
            follower.told(end)


def _held(follower: Follower, worker_id: int) -> int | None:
    try:
        return follower.held(worker_id)
    except Exception:
        return None


def _on_sigchld(signum: int, frame: Any, previous: Any) -> None:
    # In the main thread, between two bytecodes of whatever it was doing: only notes, no logging.
    with _lock:
        _look(time.monotonic())
        holding = bool(_waiting)
    if holding or recent_stop():
        return  # torch's handler would raise a stop's death (or cut a stopping program short)
    if callable(previous):  # SIGCHLD's default action is to ignore it
        previous(signum, frame)


def _after_grace() -> None:
    """The grace's thread: the held workers whose stop never reached this process are deaths; torch's handler then
    runs as it would have (the signal sent again to the main thread)."""
    time.sleep(STOP_GRACE_S)
    deaths = False
    with _lock:
        now = time.monotonic()
        for follower, end in list(_waiting):
            if now - end.at < STOP_GRACE_S:
                continue
            _waiting.remove((follower, end))
            if not stopped_with_job(end.signum, end.at):
                follower.told(end)
                deaths = True
    if deaths and _handler.current():
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGCHLD)


_handler = TemporaryHandler(signal.SIGCHLD, _on_sigchld)
