"""The errors and the warning category that loaderdoctor shows its users."""

from __future__ import annotations


class LoaderDoctorError(Exception):
    """A failure the user can act on: what went wrong, and a hint saying what to do."""

    exit_status = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(LoaderDoctorError):
    """The user's input is wrong (a bad target, an unusable loader): exit status 2."""

    exit_status = 2


class LoaderGaveUp(LoaderDoctorError, RuntimeError):
    """The guard gave up on a loader (no restart or rung left): a RuntimeError, as what torch raises where the
    plain DataLoader would have failed (a dead worker, a timeout), so the user's `except RuntimeError` still
    catches it."""


class StoppedByUser(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, see Terminated) during a measurement, with what was measured so far in `report` (a
    Report of check, a TuneReport, or, caught lower down, a LoaderReport, a LoaderTuning or a Recording; None when
    nothing was); `partial` is the same object under its older name. Still a KeyboardInterrupt for code that
    expects one. In a notebook: `except StoppedByUser as e: loaderdoctor.show(e.report)`."""

    def __init__(self, report: object = None) -> None:
        # Said in words where a notebook or a traceback shows it: what was stopped, and where its report is.
        super().__init__(_stopped_words(report))
        self.report = report

    @property
    def partial(self) -> object:
        """The partial report: `report`'s older name."""
        return self.report

    def __reduce__(self) -> tuple[type, tuple[object]]:
        return type(self), (self.report,)  # pickled with its report, not its message in its place


# What a partial report is of, by its class's name (those classes live in the layers above this one), and whether
# loaderdoctor.show() prints it (a report of check, tune or scale).
_STOPPED_KINDS = {
    "Report": ("check", True),
    "TuneReport": ("tune", True),
    "ScaleReport": ("scale", True),
    "LoaderReport": ("check of one loader", False),
    "LoaderTuning": ("tune of one loader", False),
    "Recording": ("measurement of one loader", False),
}


def _stopped_words(report: object) -> str:
    """StoppedByUser's message: what was stopped (the command, its target, the loaders it had measured) and that
    `e.report` holds what was measured."""
    if report is None:
        return "stopped before anything was measured"
    kind, shown = _STOPPED_KINDS.get(type(report).__name__, (type(report).__name__, False))
    command = getattr(report, "command", None)  # a check's Report says "run" when it is a watched script's
    kind = command if shown and isinstance(command, str) else kind
    target = getattr(report, "target", None) or getattr(report, "name", None)
    what = f"{kind} of {target!r}" if isinstance(target, str) else kind
    loaders = getattr(report, "loaders", None)
    measured = ""
    if isinstance(loaders, dict):
        names = ", ".join(repr(name) for name in list(loaders)[:3]) + (", ..." if len(loaders) > 3 else "")
        measured = f" ({names} measured)" if loaders else " (no loader measured yet)"
    show = "; loaderdoctor.show(e.report) prints it" if shown else ""
    return (
        f"{what} stopped before the end{measured}: the partial report is this exception's `report` (`except "
        f"StoppedByUser as e: e.report`; `e.partial` is the same){show}"
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM (or another signal that asks a command to end) raised in the main thread while check, tune or scale
    measure: a KeyboardInterrupt, so that it stops them as Ctrl-C does, every child ended and what was measured
    kept (see commands/running.py)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"ended by signal {signum}")
        self.signum = signum


class StopMeasuring(Exception):
    """Raised by a training step to end the probe's measuring window after this batch: the ranks of `scale`
    agree at each step on when all of them stop, so that every rank runs the same number of steps."""


class LoaderDoctorWarning(UserWarning):
    """Warnings that loaderdoctor itself issues."""
