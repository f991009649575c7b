"""Signal handlers that loaderdoctor puts in place for a while (SIGUSR2 to end a stuck next(), a SIGCHLD
wrapper around torch's, SIGTERM made an exception that cannot be lost): installed from the main thread only,
passing what is not theirs to the handler that was there before, and put back afterwards unless another handler
was set since."""

from __future__ import annotations

import _thread
import contextlib
import multiprocessing.popen_fork
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
# The signals that stop a whole job: a scheduler's (Slurm's scancel, Kubernetes, coreutils' timeout: SIGTERM to the
# process group, its DataLoader workers with it), a terminal's (Ctrl-C, Ctrl-\\), a closed session's.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
# Presses of Ctrl-C this close to the one before are one press (people press it three times within 40 ms): the
# clean-up and the summary it starts are not cut short by the rest of the burst; a press after a pause insists.
PRESS_BURST_S = 1.0
# A worker ended by a stop signal within this long of this process getting the same one was stopped with the job
# (the signal went to the whole group): each process gets it at once, and a worker's end comes a moment after.
SAME_STOP_S = 5.0

_stops: dict[int, float] = {}  # stop signal -> when this process last got it (time.monotonic())
_installed: list[SignalRaises] = []  # the SignalRaises in place now


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
    every child's exit, wherever the main thread is (see job/script.py's _closed). A signal handler can only be
    set from the main thread: elsewhere the block runs as it is."""
    if not in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def note_stop(signum: int) -> None:
    """This process got stop signal `signum` now (a handler of loaderdoctor's saw it, whoever handles it)."""
    if signum in STOP_SIGNALS:
        _stops[signum] = time.monotonic()


def stopped_with_job(signum: int | None, at: float | None = None) -> bool:
    """Whether a worker that stop signal `signum` ended (at `at`, time.monotonic(); now by default) was stopped with
    this process: it got the same signal within SAME_STOP_S of then, as a signal to the whole process group does."""
    got = _stops.get(signum) if signum is not None else None
    when = time.monotonic() if at is None else at
    return got is not None and abs(when - got) <= SAME_STOP_S


def recent_stop(at: float | None = None) -> bool:
    """Whether this process got a stop signal within SAME_STOP_S of `at` (now by default)."""
    return any(stopped_with_job(signum, at) for signum in list(_stops))


def raise_if_stopping() -> None:
    """Where a loader would start workers (a safe point: loaderdoctor's own code): once a stop signal that
    loaderdoctor raises came (SIGTERM under `run`), its exception is raised here again, so that a job being stopped
    starts no worker (its exception may have been caught by the program); a Ctrl-C whose KeyboardInterrupt is still
    held back (it came in the standard library's code) is raised here, before any worker starts. A Ctrl-C already
    raised is not raised again: a program may catch it and go on (to its validation, say)."""
    for handler in list(_installed):
        handler.raise_held_or_stop()


_presses = 0  # Ctrl-Cs received while held (a burst counted once)
_last_press = 0.0
_held = False


def hold_interrupt() -> None:
    """Until release_interrupt(), Ctrl-C is recorded rather than raised (the rest of a burst too: see PRESS_BURST_S;
    one after a pause raises at once: the user insists). Only in the main thread, and only where Ctrl-C has Python's
    default handler (the command line's, while it imports)."""
    global _held
    if _held or not in_main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    signal.signal(signal.SIGINT, _record_press)
    _held = True


def release_interrupt() -> bool:
    """Put Python's Ctrl-C handler back, where hold_interrupt() replaced it; whether Ctrl-C was pressed meanwhile."""
    global _held, _presses
    if not _held:
        return False
    if signal.getsignal(signal.SIGINT) is _record_press:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    pressed, _held, _presses = _presses > 0, False, 0
    return pressed


def _record_press(signum: int, frame: Any) -> None:
    global _presses, _last_press
    now = time.monotonic()
    if _presses and now - _last_press < PRESS_BURST_S:
        _last_press = now
        return  # the same press, again
    _presses, _last_press = _presses + 1, now
    if _presses > 1:
        release_interrupt()
        raise KeyboardInterrupt


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
    A forked child (a DataLoader worker) that gets the signal ends by it, as it would without this handler.
    With `burst_s`, a signal that comes within `burst_s` of the one before (a key pressed three times fast) is the
    same one: noted, not raised again; one after a pause raises again. For SIGINT, Python's own handler
    (KeyboardInterrupt) counts as none: this one takes its place."""

    def __init__(self, signum: int, exception: Callable[[int], BaseException], *, burst_s: float = 0.0) -> None:
        self.signum = signum
        self.received: int | None = None
        self.burst_s = burst_s
        self._last_at: float | None = None  # when the last signal came (see burst_s)
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
        _installed.append(self)
        return True

    def uninstall(self) -> None:
        """Put back the handler and the unraisable hook it replaced, each unless another was set since. With
        `burst_s`, a burst still under way is waited out first (at most 2 x burst_s): the rest of its presses would
        otherwise reach the handler put back (Python's KeyboardInterrupt, in the interpreter's exit)."""
        if not self._handler.installed or not in_main_thread():
            return
        given_up_at = time.monotonic() + 2 * self.burst_s
        while self._in_burst() and time.monotonic() < given_up_at:
            time.sleep(0.01)
        with self._lock:
            self._handler.uninstall()
            self._watching = None
        if self in _installed:
            _installed.remove(self)
        if sys.unraisablehook == self._unraisable and self._hook_before is not None:
            sys.unraisablehook = self._hook_before
        self._hook_before = self._raised = None
        self._pending = False
        self._last_at = None

    def _unraisable(self, unraisable: Any) -> None:
        if self._raised is not None and unraisable.exc_value is self._raised:
            self._pending = True  # swallowed: the watcher sends the signal again
            return
        if self._hook_before is not None:
            self._hook_before(unraisable)

    def _in_burst(self) -> bool:
        return self._last_at is not None and time.monotonic() - self._last_at < self.burst_s

    def settle(self) -> None:
        """The signal that came was taken as the end of what it stopped (a script): one held back is not sent again,
        and the rest of its burst is absorbed; a signal after a pause (with `burst_s`) raises as usual."""
        with self._lock:
            self._pending = False
            self._waiting_since = None
            if self.received is not None:
                self._last_at = time.monotonic()

    def raise_held_or_stop(self) -> None:
        """Raise the exception of a signal that came and is held back (see raise_if_stopping), or of a stop signal
        other than Ctrl-C that came at all (the job ends: raised again wherever it is asked). In the main thread only,
        where the signal's exception belongs."""
        if self.received is None or not self.installed or not in_main_thread():
            return
        if self._pending:
            with self._lock:
                self._pending = False  # raised now: the watcher sends it no more
                self._waiting_since = None
            raised = self._raised = self._exception(self.received)
            raise raised
        if self.received in STOP_SIGNALS and self.received != signal.SIGINT:
            raise self._exception(self.received)

    def _handle(self, signum: int, frame: Any, previous: Any) -> None:
        if os.getpid() != self._pid:  # a worker forked while installed: as if we were not there
            if not (callable(previous) and _in_fork_hooks(frame)):
                chain(previous, signum, frame)
            # else: in its fork hooks, whose exceptions Python only prints ("Exception ignored in: <function
            # _after_fork>"); its parent, stopped too, ends it
            return
        note_stop(signum)
        if previous not in (signal.SIG_DFL, None, signal.default_int_handler):
            chain(previous, signum, frame)  # not ours: as if we were not there
            return
        now = time.monotonic()
        if not self._pending and self._last_at is not None and now - self._last_at < self.burst_s:
            self._last_at = now
            return  # the same press, again
        self._last_at = now
        self.received = signum
        self._watch()
        now = time.monotonic()
        self._waiting_since = self._waiting_since or now
        if frame is not None and (frame.f_code is _UNRAISABLE_CODE or (
                (_in_standard_library(frame) or _making_an_iterator(frame))
                and now - self._waiting_since < WAIT_FOR_SAFE_S)):  # fmt: skip
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


_forked_child_starting = False  # set just before a fork; in the child, until its fork hooks have run


def _forking() -> None:
    global _forked_child_starting
    _forked_child_starting = True


def _forked() -> None:
    global _forked_child_starting
    _forked_child_starting = False


# A flag's toggle at each fork, registered once: a child's fork hooks (threading's, logging's) run after the
# first and before the last (registered after them, as this module is imported after them).
os.register_at_fork(before=_forking, after_in_parent=_forked, after_in_child=_forked)


def _in_fork_hooks(frame: Any) -> bool:
    """Whether a forked child runs its fork hooks, inside os.fork(): those registered before this module's (the flag),
    or any while multiprocessing forks a process (its Popen has no pid yet)."""
    if _forked_child_starting:
        return True
    while frame is not None:
        if frame.f_code is _FORK_LAUNCH and "pid" not in getattr(frame.f_locals.get("self"), "__dict__", {"pid": 0}):
            return True
        frame = frame.f_back
    return False


_ITERATOR_SETUP = ("__init__", "_reset")  # torch's iterator methods whose attributes its __del__ needs, all set
_SETUP_DEPTH = 12


def _making_an_iterator(frame: Any) -> bool:
    """Whether `frame` (or one of its callers, close by) is torch's DataLoader iterator being made or reset: an
    exception there leaves an iterator that its own __del__ cannot shut down ("Exception ignored in: ... no
    attribute '_workers_status'"), where the same signal a moment later ends the workers cleanly."""
    dataloader = sys.modules.get("torch.utils.data.dataloader")
    base = getattr(dataloader, "_BaseDataLoaderIter", None)
    for _ in range(_SETUP_DEPTH):
        if frame is None or base is None:
            return False
        if frame.f_code.co_name in _ITERATOR_SETUP and isinstance(frame.f_locals.get("self"), base):
            return True
        frame = frame.f_back
    return False


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
_FORK_LAUNCH = multiprocessing.popen_fork.Popen._launch.__code__
