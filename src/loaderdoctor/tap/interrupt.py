"""Ends a next() stuck in the main thread (loading without workers), and nothing else."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from loaderdoctor.tap.signals import TemporaryHandler, chain

INTERRUPT_SIGNAL = signal.SIGUSR2


class Interrupted(BaseException):
    """Raised in the main thread to end a stalled next() when loading runs in the main process."""


class MainThreadInterrupter:
    """Lets a watchdog's thread end a next() stuck in the main thread, and nothing else: the signal raises
    only while `armed`, which the caller sets around next() alone, and only when this interrupter sent it. A
    context manager: the handler is in place while inside it (in the main thread), and the one before it is put
    back on leaving; a signal that is not ours meanwhile goes to that one (see chain)."""

    def __init__(self) -> None:
        self.armed = False
        self._handler = TemporaryHandler(INTERRUPT_SIGNAL, self._handle)
        self._sent = False  # this interrupter sent the signal now on its way
        # Held while a signal is sent, and while the handler is put back: so that ours never reaches the user's.
        self._lock = threading.Lock()

    @property
    def installed(self) -> bool:
        return self._handler.installed

    def __enter__(self) -> MainThreadInterrupter:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def install(self) -> None:
        """Put the handler in place, from the main thread (elsewhere nothing happens); once until uninstall()."""
        self._handler.install()

    def uninstall(self) -> None:
        """Put back the handler that was there before, unless another was set since."""
        self.armed = False  # first: a signal that comes while this waits for the lock raises nothing
        with self._lock:
            if not self._handler.installed:
                return
            deadline = time.monotonic() + 1.0
            while self._sent and time.monotonic() < deadline:
                time.sleep(0.001)  # ours is pending: let our handler take it (it does nothing, unarmed)
            self._handler.uninstall()

    def _handle(self, signum: int, frame: Any, previous: Any) -> None:
        ours, self._sent = self._sent, False
        if ours:
            if self.armed:
                raise Interrupted()
            return  # next() returned meanwhile: nothing left to end
        chain(previous, signum, frame)

    def why_not(self) -> str:
        """Why interrupt() sends nothing now, in words."""
        if self._handler.installed and not self._handler.current():
            name = signal.Signals(INTERRUPT_SIGNAL).name
            return f"{name} has another handler now: the stuck next() cannot be interrupted"
        if not self.armed:
            return ("the stuck wait is not inside next() (iter() starting the epoch's workers, say), which alone can "
                    "be interrupted: see the stack above")  # fmt: skip
        return "the main thread cannot be interrupted from here"

    def interrupt(self) -> bool:
        """End the main thread's next(), if it is in one; whether a signal was sent."""
        with self._lock:
            # The user may have set their own handler since: a signal to it would not end the next().
            if not (self._handler.installed and self.armed and self._handler.current()):
                return False
            self._sent = True
            signal.pthread_kill(threading.main_thread().ident or 0, INTERRUPT_SIGNAL)
            return True
