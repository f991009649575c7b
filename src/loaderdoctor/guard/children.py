"""Deaths of guarded workers raise inside the guard's own next(), never in the user's code.

torch's SIGCHLD handler raises "DataLoader worker ... is killed by signal" in the main thread at whatever line
it is running: during a training step, that error escapes the loader and ends the job. This module wraps that
handler while guarded workers are alive (and puts it back when none is): for a guarded loader's worker the error
is raised only while the main thread is inside that loader's next(); otherwise the loader is flagged and
recovers at its next next(). Deaths of other loaders' workers raise exactly as before. The same handler lets the
watchdog's thread end a next() that waits on workers it has killed (with forkserver and spawn they are not this
process's children, so no SIGCHLD comes by itself).
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Protocol

from loaderdoctor.tap.deathwatch import exit_status
from loaderdoctor.tap.signals import TemporaryHandler


class Watched(Protocol):
    """What the handler flags on the loader that owns some workers."""

    died: str | None  # torch's report of a worker's death, kept for the loader's next next()
    interrupt_requested: bool


class GuardInterrupt(RuntimeError):
    """Raised in the main thread's next() after the watchdog ended the workers it was waiting on."""


_owners: dict[int, Watched] = {}  # worker pid -> the guarded loader part that started it
_armed: Watched | None = None  # whose next() the main thread is in


def install() -> bool:
    """Wrap the current SIGCHLD handler (torch's, once a loader started workers) while guarded workers live:
    until forget() has forgotten the last of them. Only the main thread can; whether the wrapper is in place."""
    return _handler.install()


def watch(pids: list[int], owner: Watched) -> None:
    for pid in pids:
        _owners[pid] = owner


def forget(pids: list[int]) -> None:
    for pid in pids:
        _owners.pop(pid, None)
    if not _owners:
        _handler.uninstall()


def arm(owner: Watched) -> None:
    """The main thread enters `owner`'s next(): errors about its workers may be raised now."""
    global _armed
    if threading.current_thread() is threading.main_thread():
        _armed = owner


def disarm() -> None:
    global _armed
    if threading.current_thread() is threading.main_thread():
        _armed = None


def interrupt(owner: Watched) -> bool:
    """From another thread: end the main thread's next() in `owner`, if it is in one; whether it was asked."""
    if not _handler.installed or _armed is not owner:
        return False
    owner.interrupt_requested = True
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGCHLD)
    return True


def _on_sigchld(signum: int, frame: Any, previous: Any) -> None:
    # Runs in the main thread between two bytecodes of whatever it was doing: no locks, no logging.
    # SIGCHLD's default action is to ignore it: only a handler that is a function has anything to do.
    try:
        if callable(previous):
            previous(signum, frame)
    except RuntimeError as error:
        owners = []
        for pid, owner in list(_owners.items()):
            if owner not in owners and _failed(pid):
                owners.append(owner)
        if not owners:
            raise  # not a guarded worker: torch's own behaviour
        for owner in owners:
            owner.died = str(error)
        if any(owner is _armed for owner in owners):
            raise
        return
    armed = _armed
    if armed is not None and armed.interrupt_requested:
        armed.interrupt_requested = False
        raise GuardInterrupt("the guard's watchdog ended the workers this next() was waiting on")


def _failed(pid: int) -> bool:
    """Whether the child `pid` ended as torch's handler counts a failure (killed by a signal, or a non-zero exit
    status), seen without reaping it, as torch looks (waitid with WNOWAIT): from the process, not the message."""
    return bool(exit_status(pid))


_handler = TemporaryHandler(signal.SIGCHLD, _on_sigchld)  # installed while guarded workers live
