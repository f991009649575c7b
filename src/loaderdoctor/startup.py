"""Ctrl-C while the `loaderdoctor` command line is still importing (torch takes seconds) is held until the imports
are done, so that no module is left half-imported and the command ends as stopped (130) without a traceback."""

from __future__ import annotations

import itertools
import signal
import sys
import threading
from pathlib import Path
from typing import Any

_pressed = 0  # Ctrl-Cs received while held
_held = False


def is_command_line() -> bool:
    """Whether this process is the `loaderdoctor` command (its console script, or `python -m loaderdoctor`), as
    opposed to a program that imports loaderdoctor as a library, whose Ctrl-C is left alone."""
    if sys.argv and Path(sys.argv[0]).name == "loaderdoctor":
        return True
    # `python -m loaderdoctor`: argv[0] is "-m" while the package imports; orig_argv names the module
    return sys.argv[:1] == ["-m"] and ("-m", "loaderdoctor") in itertools.pairwise(sys.orig_argv)


def hold_interrupt() -> None:
    """Until release_interrupt(), Ctrl-C is recorded rather than raised (a second one raises at once: the user
    insists). Only in the command line's main thread, and only where Ctrl-C has Python's default handler."""
    global _held
    if _held or not is_command_line() or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    signal.signal(signal.SIGINT, _record)
    _held = True


def release_interrupt() -> bool:
    """Put Python's Ctrl-C handler back, where hold_interrupt() replaced it; whether Ctrl-C was pressed meanwhile."""
    global _held, _pressed
    if not _held:
        return False
    if signal.getsignal(signal.SIGINT) is _record:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    pressed, _held, _pressed = _pressed > 0, False, 0
    return pressed


def _record(signum: int, frame: Any) -> None:
    global _pressed
    _pressed += 1
    if _pressed > 1:
        release_interrupt()
        raise KeyboardInterrupt


# On import, first thing in loaderdoctor/__init__.py: before torch's import begins.
hold_interrupt()
