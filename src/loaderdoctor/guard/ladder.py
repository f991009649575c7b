"""The fallback ladder: the next, safer Settings to retry a failed loader with."""

from __future__ import annotations

from loaderdoctor.settings import Settings

REASONS = ("stall", "worker-died")
# Each start method hands workers less of the parent's state than the one before: forkserver forks from a
# clean server process, spawn starts a fresh interpreter.
_SAFER_START = {"fork": "forkserver", "forkserver": "spawn"}


def next_rung(settings: Settings, reason: str, *, picklable: bool = True) -> Settings | None:
    """The Settings to retry with after a `reason` failure, or None when no rung is left.

    fork -> forkserver -> spawn; then half the workers, down to 1; last num_workers=0. Without `picklable`
    (the dataset or its functions cannot be sent to a fresh process) the start method stays. Every reason
    walks the same ladder for now; it is an argument so that a later rung can depend on it (an OOM kill,
    say, is better met with fewer workers at once).
    """
    if reason not in REASONS:
        raise ValueError(f"unknown failure reason {reason!r}; one of {', '.join(REASONS)}")
    if settings.num_workers == 0:
        return None
    safer = _SAFER_START.get(settings.effective_start_method or "")
    if safer is not None and picklable:
        return settings.replace(start_method=safer)
    if settings.num_workers > 1:
        return settings.replace(num_workers=settings.num_workers // 2)
    return settings.replace(num_workers=0)
