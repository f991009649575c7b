"""One background-thread lifecycle: a daemon thread that runs a tick every interval (or sooner, when woken) until
stopped, and is stopped the same way from any thread, its own included."""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundThread:
    """A daemon thread called `name` that calls `tick` every `interval_s` (the first call one interval after
    start()) until stop(); wake() has the next tick run now, and the interval count again from there.

    stop() may be called from any thread, any number of times, before or after start(): it ends the loop and
    waits for a tick under way, except when called from the thread itself (a tick that decides it is done), which
    cannot wait for itself and returns at once; the loop then ends as that tick returns. A tick's exceptions are
    its owner's to handle: one that escapes ends the thread, reported by threading.excepthook as for any thread.
    """

    def __init__(self, name: str, tick: Callable[[], object], interval_s: float) -> None:
        self.interval_s = interval_s
        self._tick = tick
        self._stopping = threading.Event()
        self._woken = threading.Event()  # set by wake() and by stop(): the wait for the next tick ends
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def name(self) -> str:
        return self._thread.name

    @property
    def stopping(self) -> bool:
        """Whether stop() was called (the thread may still be finishing its tick)."""
        return self._stopping.is_set()

    def start(self) -> BackgroundThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the loop, and wait until the thread has ended unless called from the thread itself."""
        self._stopping.set()
        self._woken.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._let_go()

    def wake(self) -> None:
        """Run the next tick now (after the one under way, if any), from any thread."""
        self._woken.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait, at most `timeout` seconds (threading's word), for a thread that ends by itself (its tick called
        stop())."""
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while True:
                self._woken.wait(self.interval_s)
                self._woken.clear()
                if self._stopping.is_set():
                    break
                self._tick()
        finally:
            self._let_go()

    def _let_go(self) -> None:
        # The tick is mostly its owner's bound method, and the owner holds this thread: once stopped, neither may
        # keep the other alive (the owner, and what it holds, such as a loader and its workers, would wait for
        # the garbage collector), as threading.Thread lets go of its target once it has run.
        self._tick = _nothing


def _nothing() -> None:
    """The tick of a stopped thread."""
