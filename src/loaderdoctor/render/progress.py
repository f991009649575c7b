"""LiveProgress: the one-line display on stderr of what is being measured, while check and tune run."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from loaderdoctor.probe.session import ProbeProgress

_REFRESH_S = 0.1


class LiveProgress:
    """A one-line progress display on stderr while loaders are measured (nothing when it is not a terminal)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            auto_refresh=False,  # no refresh thread: nothing of ours runs while workers fork
        )
        self._task = self._progress.add_task("starting", total=None)
        self._last = 0.0
        self._shown = console.is_terminal

    def __enter__(self) -> LiveProgress:
        if self._shown:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._shown:
            self._progress.stop()

    def check_update(self, name: str, phase: str, p: ProbeProgress) -> None:
        """check's progress: which loader, which phase (measure, verify, tune), how far."""
        verb = {"measure": "measuring", "tune": "searching settings for"}.get(phase, "verifying the fix for")
        self._show(
            f"{verb} '{name}': epoch {p.epoch + 1}/{p.epochs}, {p.batches} batches, "
            f"{p.elapsed_s:.1f} of ~{p.budget_s:.0f} s"
        )

    def tune_update(self, name: str, settings: str, p: ProbeProgress) -> None:
        """tune's progress: which loader, the settings of the trial under way, how far."""
        self._show(f"tuning '{name}': {settings}: {p.batches} batches, {p.elapsed_s:.1f} of ~{p.budget_s:.1f} s")

    def scale_update(self, what: str) -> None:
        """scale's progress: the launch under way ("measuring under 2 ranks")."""
        self._last = 0.0  # a launch starts seldom: always shown
        self._show(what)

    def _show(self, description: str) -> None:
        now = time.monotonic()
        if not self._shown or now - self._last < _REFRESH_S:
            return
        self._last = now
        self._progress.update(self._task, description=description)
        self._progress.refresh()
