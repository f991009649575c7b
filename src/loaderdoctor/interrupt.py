"""Ends a next() stuck in the main thread (loading without workers), and nothing else."""

from __future__ import annotations

import signal
import threading
from typing import Any

INTERRUPT_SIGNAL = signal.SIGUSR2


class Interrupted(BaseException):
    """Raised in the main thread to end a stalled next() when loading runs in the main process."""


class MainThreadInterrupter:
    """Lets a watchdog's thread end a next() stuck in the main thread, and nothing else: the signal raises
    only while `armed`, which the caller sets around next() alone. A context manager: the handler is in place
    while inside it, and the one before it is put back on leaving."""

    def __init__(self) -> None:
        self.available = threading.current_thread() is threading.main_thread()
        self.armed = False
        self._previous: Any = None

    def __enter__(self) -> MainThreadInterrupter:
        if self.available:
            self._previous = signal.signal(INTERRUPT_SIGNAL, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.armed = False
        if self.available:
            signal.signal(INTERRUPT_SIGNAL, self._previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.armed:
            raise Interrupted()

    def interrupt(self) -> bool:
        """End the main thread's next(), if it is in one; whether a signal was sent."""
        # The user may have set their own handler since: a signal to it would not end the next().
        if not (self.available and self.armed and signal.getsignal(INTERRUPT_SIGNAL) == self._handle):
            return False
        signal.pthread_kill(threading.main_thread().ident or 0, INTERRUPT_SIGNAL)
        return True


_kept: MainThreadInterrupter | None = None


def kept_interrupter() -> MainThreadInterrupter | None:
    """The process's interrupter, entered once in the main thread and kept installed, for callers that arm
    it around every next() and cannot afford to install a handler each time; None outside the main thread.

    Kept installed, it ignores the signal while not armed (where the default action would end the process).
    """
    global _kept
    if threading.current_thread() is not threading.main_thread():
        return None
    if _kept is None:
        _kept = MainThreadInterrupter().__enter__()
    return _kept
