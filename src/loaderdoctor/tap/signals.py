"""Signal handlers that loaderdoctor puts in place for a while (SIGUSR2 to end a stuck next(), a SIGCHLD
wrapper around torch's, SIGTERM made an exception that cannot be lost): installed from the main thread only,
passing what is not theirs to the handler that was there before, and put back afterwards unless another handler
was set since."""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

Handler = Callable[[int, Any, Any], None]  # (signum, frame, the handler it replaced)
# How long after its exception was swallowed a signal is sent again: past the hook that swallowed it.
SEND_AGAIN_AFTER_S = 0.001


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


class SignalRaises:
    """While installed, `signum` raises `exception(signum)` in the main thread, and that exception cannot be lost.
    Python runs a handler between any two bytecodes of the main thread, some of them in code whose exceptions it
    can only print ("Exception ignored in: ..."): a fork hook such as logging's, a __del__, a weakref or gc
    callback. There the exception would vanish and the program run on, so each one swallowed (Python hands it to
    sys.unraisablehook, which is ours while installed) has the signal sent again a moment later, from a thread of
    its own (sent from the hook, it would raise in the hook), to raise in the code the main thread runs then.
    `received` is the signal once one came: a program that ends before the signal comes again was still ended
    by it. A handler that was in place before gets the signal instead (see chain); one set after replaces this
    one."""

    def __init__(self, signum: int, exception: Callable[[int], BaseException]) -> None:
        self.signum = signum
        self.received: int | None = None
        self._exception = exception
        self._handler = TemporaryHandler(signum, self._handle)
        self._raised: list[BaseException] = []  # the exceptions raised so far, to know them when swallowed
        self._hook: Callable[[Any], None] | None = None
        self._hook_before: Callable[[Any], None] | None = None
        self._lock = threading.Lock()  # held while the signal is sent again, and while the handler is put back
        self._in_hook = False

    def __enter__(self) -> SignalRaises:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    @property
    def installed(self) -> bool:
        return self._handler.installed

    def install(self) -> bool:
        """Put the handler (and the unraisable hook) in place, from the main thread; whether it is in place."""
        if self._handler.installed or not self._handler.install():
            return self._handler.installed
        before = self._hook_before = sys.unraisablehook

        def hook(unraisable: Any) -> None:
            if any(unraisable.exc_value is raised for raised in self._raised):
                self._in_hook = True  # a signal that comes now raises nothing: the hook would swallow it too
                try:
                    _thread.start_new_thread(self._send_again, ())  # not threading's: its start() waits
                finally:
                    self._in_hook = False
                return
            before(unraisable)

        sys.unraisablehook = self._hook = hook
        return True

    def uninstall(self) -> None:
        """Put back the handler and the unraisable hook it replaced, each unless another was set since."""
        if not self._handler.installed or not in_main_thread():
            return
        with self._lock:
            self._handler.uninstall()
        if sys.unraisablehook is self._hook and self._hook_before is not None:
            sys.unraisablehook = self._hook_before
        self._hook = self._hook_before = None
        self._raised.clear()

    def _handle(self, signum: int, frame: Any, previous: Any) -> None:
        if previous not in (signal.SIG_DFL, None):
            chain(previous, signum, frame)
            return
        self.received = signum
        if self._in_hook:
            _thread.start_new_thread(self._send_again, ())
            return
        raised = self._exception(signum)
        self._raised.append(raised)
        raise raised

    def _send_again(self) -> None:
        time.sleep(SEND_AGAIN_AFTER_S)
        with self._lock:
            if self._handler.current():
                signal.pthread_kill(threading.main_thread().ident or 0, self.signum)
