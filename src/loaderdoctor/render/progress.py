"""The one-line display of what is being measured while check, tune and scale run: on a terminal's stderr
(LiveProgress), or in a Jupyter cell's output (NotebookProgress), with the phase and the time left of the budget."""

from __future__ import annotations

import sys
import time
from html import escape
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from loaderdoctor.errors import StoppedByUser
from loaderdoctor.probe.measuring import ProbeProgress
from loaderdoctor.render.terminal import SafeConsole, visible

_REFRESH_S = 0.1
# A notebook's line is a message to the browser each time: a few a second are enough to read it.
_NOTEBOOK_REFRESH_S = 0.25


class _Line:
    """What the display says: the figures of each update in words, the time left of the whole budget when it is
    known, and when each line is worth showing (at most one per `refresh_s`)."""

    def __init__(self, budget_s: float | None, refresh_s: float) -> None:
        self._budget_s = budget_s
        self._refresh_s = refresh_s
        self._started = time.monotonic()
        self._last = 0.0
        self.words = "starting"  # what is under way, without the time

    def check_update(self, name: str, phase: str, p: ProbeProgress) -> None:
        """check's progress: which loader, which phase (measure, verify, tune), how far."""
        verb = {"measure": "measuring", "tune": "searching settings for"}.get(phase, "verifying the fix for")
        self._say(f"{verb} '{name}': epoch {p.epoch + 1}/{p.epochs}, {p.batches} batches", p)

    def tune_update(self, name: str, settings: str, p: ProbeProgress) -> None:
        """tune's progress: which loader, the settings of the trial under way, how far."""
        self._say(f"tuning '{name}': {settings}: {p.batches} batches", p)

    def scale_update(self, what: str) -> None:
        """scale's progress: the launch under way ("measuring under 2 ranks"), always shown (a launch starts
        seldom)."""
        self._last = 0.0
        self._say(what, None)

    def _say(self, words: str, p: ProbeProgress | None) -> None:
        now = time.monotonic()
        if now - self._last < self._refresh_s:
            return
        self._last = now
        self.words = words
        self._show(words + self._how_far(p, now))

    def _how_far(self, p: ProbeProgress | None, now: float) -> str:
        """The time left of the whole budget when it is known, else how far this phase is into its own share."""
        if self._budget_s is not None:
            left = self._budget_s - (now - self._started)
            if left < 0.5:
                return f"; the {self._budget_s:g} s budget is spent, finishing"
            return f"; ~{left:.0f} s left of the {self._budget_s:g} s budget"
        return "" if p is None else f", {p.elapsed_s:.1f} of ~{p.budget_s:.0f} s"

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def _show(self, line: str) -> None:
        raise NotImplementedError


class LiveProgress(_Line):
    """A one-line progress display on stderr while loaders are measured (nothing when it is not a terminal),
    gone when they are."""

    def __init__(self, console: Console, budget_s: float | None = None) -> None:
        super().__init__(budget_s, _REFRESH_S)
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),  # a loader's name is text, never markup
            TimeElapsedColumn(),
            console=console,
            transient=True,
            auto_refresh=False,  # no refresh thread: nothing of ours runs while workers fork
        )
        self._task = self._progress.add_task("starting", total=None)
        self._shown = console.is_terminal

    def __enter__(self) -> LiveProgress:
        if self._shown:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._shown:
            self._progress.stop()

    def _show(self, line: str) -> None:
        if self._shown:
            self._progress.update(self._task, description=line)
            self._progress.refresh()


class NotebookProgress(_Line):
    """The same line in a Jupyter cell's output: one display, updated in place (IPython's display handle), left
    at the end saying how it ended and what it did last."""

    def __init__(self, command: str, budget_s: float | None = None) -> None:
        super().__init__(budget_s, _NOTEBOOK_REFRESH_S)
        self._command = command
        self._handle: Any = None

    def __enter__(self) -> NotebookProgress:
        from IPython.display import display  # only in a notebook, where IPython is there

        self._handle = display(self._bundle(self.words), raw=True, display_id=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, *rest: object) -> None:
        if kind is None:
            ended = f"done in {self.elapsed_s():.1f} s"
        elif issubclass(kind, StoppedByUser):
            ended = f"stopped after {self.elapsed_s():.1f} s (what was measured is the exception's `report`)"
        elif issubclass(kind, KeyboardInterrupt):
            ended = f"stopped after {self.elapsed_s():.1f} s"
        else:
            ended = f"failed after {self.elapsed_s():.1f} s"
        self._handle.update(self._bundle(f"{ended}; last: {self.words}"), raw=True)

    def _show(self, line: str) -> None:
        self._handle.update(self._bundle(line), raw=True)

    def _bundle(self, line: str) -> dict[str, str]:
        text = visible(f"loaderdoctor {self._command}: {line}")
        return {"text/plain": text, "text/html": f'<pre style="margin: 0">{escape(text)}</pre>'}


def in_jupyter() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell): a notebook shows what it displays."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too odd to ask is no notebook of ours
        return False
    # Colab's shell is a subclass of it, under a name of its own
    return any(kind.__name__ == "ZMQInteractiveShell" for kind in type(shell).__mro__)


def watching_display(command: str, budget_s: float | None) -> LiveProgress | NotebookProgress:
    """The display for a Python call of check, tune or scale: in a Jupyter cell in a notebook, else on stderr
    (shown only when stderr is a terminal)."""
    if in_jupyter():
        return NotebookProgress(command, budget_s)
    return LiveProgress(SafeConsole(stderr=True, highlight=False), budget_s)
