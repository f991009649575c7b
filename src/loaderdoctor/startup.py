"""Ctrl-C while the `loaderdoctor` command line (or a rank that `loaderdoctor run` started) is still importing
(torch takes seconds) is held until the imports are done, so that no module is left half-imported and the command
ends as stopped (130) without a traceback (the hold itself: tap/signals.py)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from loaderdoctor.tap.signals import hold_interrupt as _hold
from loaderdoctor.tap.signals import release_interrupt as release_interrupt

# The modules run as `python -m MODULE` that are the command line: loaderdoctor's own, and run's ranks.
COMMAND_MODULES = ("loaderdoctor", "loaderdoctor.job")


def is_command_line() -> bool:
    """Whether this process is the `loaderdoctor` command (its console script, or `python -m loaderdoctor`) or one
    of the ranks `loaderdoctor run` starts, as opposed to a program that imports loaderdoctor as a library, whose
    Ctrl-C is left alone."""
    if sys.argv and Path(sys.argv[0]).name == "loaderdoctor":
        return True
    # `python -m loaderdoctor`: argv[0] is "-m" while the package imports; orig_argv names the module
    pairs = set(itertools.pairwise(sys.orig_argv))
    return sys.argv[:1] == ["-m"] and any(("-m", module) in pairs for module in COMMAND_MODULES)


def hold_interrupt() -> None:
    """In the command line (see is_command_line), Ctrl-C held until release_interrupt() (see tap/signals.py)."""
    if is_command_line():
        _hold()


# On import, first thing in loaderdoctor/__init__.py: before torch's import begins.
hold_interrupt()
