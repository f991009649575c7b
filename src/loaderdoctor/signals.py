"""Signal handlers that loaderdoctor puts in place for a while (SIGUSR2 to end a stuck next(), a SIGCHLD
wrapper around torch's): installed from the main thread only, passing what is not theirs to the handler that
was there before, and put back afterwards unless another handler was set since."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

Handler = Callable[[int, Any, Any], None]  # (signum, frame, the handler it replaced)


def chain(previous: Any, signum: int, frame: Any) -> None:
    """Do what the handler that was in place before would have done with a signal that is not ours: call it,
    ignore the signal, or take the default action (for SIGUSR2, ending the process) as if nothing was installed."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)  # the default action; if it returns, the signal's default is to ignore it


@contextlib.contextmanager
def child_deaths_quiet() -> Iterator[None]:
    """SIGCHLD left at its default (children kept for their parents to wait on, nothing raised) for the block's
    time, the handler before it put back after: torch's SIGCHLD handler raises a dead worker's error again at
    every child's exit, wherever the main thread is (see watch/script.py's _closed). A signal handler can only be
    set from the main thread: elsewhere the block runs as it is."""
    if not in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class TemporaryHandler:
    """One handler for one signal, in place between install() and uninstall(). Each install() puts in a new
    function that hands `handler` the handler it replaced (what a signal that is not its own goes to, see
    chain), and keeps it: a handler set over ours that still calls ours (as ours calls the one before) goes on
    reaching the one before ours after uninstall(), and a later install() never makes a loop."""

    def __init__(self, signum: int, handler: Handler) -> None:
        self.signum = signum
        self.handler = handler
        self._installed: Callable[[int, Any], None] | None = None
        self._previous: Any = None

    @property
    def installed(self) -> bool:
        return self._installed is not None

    def install(self) -> bool:
        """Put the handler in place, from the main thread (elsewhere nothing happens); whether it is in place."""
        if self._installed is None and in_main_thread():
            previous: list[Any] = [None]
            handler = self.handler

            def installed(signum: int, frame: Any) -> None:
                handler(signum, frame, previous[0])

            previous[0] = self._previous = signal.signal(self.signum, installed)
            self._installed = installed
        return self.installed

    def uninstall(self) -> None:
        """Put back the handler it replaced, unless another was set since (main thread only: elsewhere it stays,
        passing everything on, until the next chance)."""
        if self._installed is None or not in_main_thread():
            return
        if self.current():
            signal.signal(self.signum, self._previous)
        self._installed = self._previous = None

    def current(self) -> bool:
        """Whether this handler is the one in place now."""
        return self._installed is not None and signal.getsignal(self.signum) is self._installed
