"""Signal handlers that loaderdoctor puts in place for a while (SIGUSR2 to end a stuck next(), a SIGCHLD
wrapper around torch's, SIGTERM made an exception that cannot be lost): installed from the main thread only,
passing what is not theirs to the handler that was there before, and put back afterwards unless another handler
was set since."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import site
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

Handler = Callable[[int, Any, Any], None]  # (signum, frame, the handler it replaced)
# How often, once a signal came, its watcher looks whether the signal must be sent again.
WATCH_EVERY_S = 0.005
# How long a signal waits for the main thread to leave the standard library's code before it raises there anyway
# (a thread.join() or a queue's get() may not return at all).
WAIT_FOR_SAFE_S = 0.5


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
    Python runs a handler between any two bytecodes of the main thread. Some of those places can only print an
    exception ("Exception ignored in: ..."): a fork hook, a __del__, a weakref or gc callback. Others must not be
    left half done: the standard library's own code, whose locks and bookkeeping assume no exception comes
    between two lines (logging's fork hook that gives its lock back, importlib's module locks, threading's
    conditions), which gets a moment (WAIT_FOR_SAFE_S) to return first. So once a signal came, a thread of its
    own (the watcher) sends it again every WATCH_EVERY_S while it is pending: held back, or its exception
    swallowed (Python hands it to sys.unraisablehook, which is ours while installed, and nothing is printed).
    `received` is the signal once one came: a program that ends before the signal comes again was still ended by
    it. A handler that was in place before gets the signal instead (see chain); one set after replaces this one.
    A forked child (a DataLoader worker) that gets the signal ends by it, as it would without this handler."""

    def __init__(self, signum: int, exception: Callable[[int], BaseException]) -> None:
        self.signum = signum
        self.received: int | None = None
        self._exception = exception
        self._handler = TemporaryHandler(signum, self._handle)
        self._raised: BaseException | None = None  # the last exception raised, to know it when swallowed
        self._pending = False  # held back or swallowed: the watcher sends the signal again
        self._waiting_since: float | None = None  # when a signal was first held back from the standard library
        self._hook_before: Callable[[Any], None] | None = None
        self._lock = threading.Lock()  # held while the watcher looks and sends, and while the handler is put back
        self._pid = 0
        self._watching: object | None = None  # the token of the installation the watcher serves

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
        self._pid = os.getpid()
        self._hook_before = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return True

    def uninstall(self) -> None:
        """Put back the handler and the unraisable hook it replaced, each unless another was set since."""
        if not self._handler.installed or not in_main_thread():
            return
        with self._lock:
            self._handler.uninstall()
            self._watching = None
        if sys.unraisablehook == self._unraisable and self._hook_before is not None:
            sys.unraisablehook = self._hook_before
        self._hook_before = self._raised = None
        self._pending = False

    def _unraisable(self, unraisable: Any) -> None:
        if self._raised is not None and unraisable.exc_value is self._raised:
            self._pending = True  # swallowed: the watcher sends the signal again
            return
        if self._hook_before is not None:
            self._hook_before(unraisable)

    def _handle(self, signum: int, frame: Any, previous: Any) -> None:
        if previous not in (signal.SIG_DFL, None) or os.getpid() != self._pid:
            chain(previous, signum, frame)  # not ours, or a worker forked while installed: as if we were not there
            return
        self.received = signum
        self._watch()
        now = time.monotonic()
        self._waiting_since = self._waiting_since or now
        if frame is not None and (frame.f_code is _UNRAISABLE_CODE or (
                _in_standard_library(frame) and now - self._waiting_since < WAIT_FOR_SAFE_S)):  # fmt: skip
            self._pending = True
            return
        self._pending = False
        self._waiting_since = None
        raised = self._raised = self._exception(signum)
        raise raised

    def _watch(self) -> None:
        """Start the watcher for this installation, once."""
        if self._watching is None:
            self._watching = token = object()
            _thread.start_new_thread(self._watcher, (token,))  # not threading's: its start() waits

    def _watcher(self, token: object) -> None:
        while True:
            time.sleep(WATCH_EVERY_S)
            with self._lock:
                if self._watching is not token or not self._handler.current():
                    return
                if self._pending:
                    signal.pthread_kill(threading.main_thread().ident or 0, self.signum)


def _in_standard_library(frame: Any) -> bool:
    """Whether `frame` runs the standard library's code (not an installed package's)."""
    name = frame.f_code.co_filename
    return name.startswith("<frozen ") or (name.startswith(_STANDARD_LIBRARY) and not name.startswith(_PACKAGES))


_STANDARD_LIBRARY = os.path.dirname(os.__file__) + os.sep
_PACKAGES = tuple(
    {os.path.join(path, "") for path in (*site.getsitepackages(), sysconfig.get_paths()["purelib"],
                                         sysconfig.get_paths()["platlib"])}
)  # fmt: skip
_UNRAISABLE_CODE = SignalRaises._unraisable.__code__
