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
    """Ctrl-C (or SIGTERM, see Terminated) during a measurement, with what was measured so far in `partial` (a
    Recording, a LoaderReport or a Report, depending on where it was caught last); still a KeyboardInterrupt for
    code that expects one."""

    def __init__(self, partial: object = None) -> None:
        # Said in words where a notebook or a traceback shows it (an empty message told nothing).
        super().__init__(
            "stopped before the end: what was measured so far is this exception's `partial`"
            if partial is not None
            else "stopped before anything was measured"
        )
        self.partial = partial


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
