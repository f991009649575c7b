"""Ends code that runs in the main thread past a time limit (a user's module or function that never returns), and
says where it was stuck."""

from __future__ import annotations

import threading
from types import TracebackType

from loaderdoctor.tap.interrupt import Interrupted, MainThreadInterrupter
from loaderdoctor.tap.signals import in_main_thread
from loaderdoctor.workers.poller import thread_stack
from loaderdoctor.workers.readings import WorkerStack

# After the limit, how often the main thread is interrupted again while it has not left the block (code that
# catches every exception, or a signal that came between two calls of a C function that retries).
INTERRUPT_AGAIN_S = 1.0


class TimeLimitPassed(Exception):
    """The block ran past its limit: `stack` is the main thread's stack when the limit passed."""

    def __init__(self, limit_s: float, stack: WorkerStack) -> None:
        super().__init__(f"still running after {limit_s:g} s")
        self.limit_s = limit_s
        self.stack = stack


class TimeLimit:
    """A block of the main thread bounded by `limit_s` seconds: once they pass, a thread of its own takes the main
    thread's stack and ends the block (Interrupted raised in it, see MainThreadInterrupter), and the block's end
    raises TimeLimitPassed with that stack, even where the block swallowed the interrupt and went on. Only in the
    main thread (from another one there is no way to end it): elsewhere, and with no limit, the block runs as
    it is."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self._interrupter = MainThreadInterrupter()
        self._done = threading.Event()
        self._stack: WorkerStack | None = None
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> TimeLimit:
        if self.limit_s is None or not in_main_thread():
            return self
        self._interrupter.install()
        self._interrupter.armed = True
        self._watcher = threading.Thread(target=self._watch, name="loaderdoctor-time-limit", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> bool:
        if self._watcher is None:
            return False
        self._interrupter.armed = False  # first: an interrupt on its way now raises nothing
        self._done.set()
        self._watcher.join()
        self._interrupter.uninstall()
        if self._stack is None or self.limit_s is None:
            return False
        if error is None or isinstance(error, Interrupted | Exception):
            raise TimeLimitPassed(self.limit_s, self._stack) from None
        return False  # Ctrl-C or SIGTERM meanwhile: that goes on

    def _watch(self) -> None:
        assert self.limit_s is not None
        if self._done.wait(self.limit_s):
            return
        self._stack = thread_stack(threading.main_thread())
        while not self._done.is_set():
            self._interrupter.interrupt()
            self._done.wait(INTERRUPT_AGAIN_S)
