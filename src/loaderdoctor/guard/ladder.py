"""The fallback ladder: the next, safer Settings to retry a failed loader with."""

from __future__ import annotations

from loaderdoctor.loader.settings import Settings

REASONS = ("stall", "worker-died")
# Each start method hands workers less of the parent's state than the one before: forkserver forks from a
# clean server process, spawn starts a fresh interpreter.
_SAFER_START = {"fork": "forkserver", "forkserver": "spawn"}


def next_rung(
    settings: Settings, reason: str, *, picklable: bool = True, per_worker_streams: bool = False
) -> Settings | None:
    """The Settings to retry with after a `reason` failure, or None when no rung is left.

    fork -> forkserver -> spawn; then half the workers, down to 1; last num_workers=0, after a stall only: a
    sample that killed a worker is never loaded in the main process, where it would kill the training process
    (torch's own DataLoader raises then, and so does the guard once no rung is left). Without `picklable`
    (the dataset or its functions cannot be sent to a fresh process) the start method stays. Every reason
    walks the same ladder down to one worker.

    With `per_worker_streams` (an IterableDataset, whose saved states are one per worker's stream and map only
    onto as many workers) the number of workers stays, so the ladder ends after the start methods; only one
    worker may hand its stream to the main process (num_workers=0), both being one stream.
    """
    if reason not in REASONS:
        raise ValueError(f"unknown failure reason {reason!r}; one of {', '.join(REASONS)}")
    if settings.num_workers == 0:
        return None
    safer = _SAFER_START.get(settings.effective_start_method or "")
    if safer is not None and picklable:
        return settings.replace(start_method=safer)
    if settings.num_workers > 1:
        return None if per_worker_streams else settings.replace(num_workers=settings.num_workers // 2)
    if reason == "worker-died":
        return None  # what killed a worker (a segfault, the OOM killer) would kill the training process
    return settings.replace(num_workers=0)


def escalation(settings: Settings) -> Settings:
    """After a stall of loading in the main process (num_workers=0), which only the guard's signal could end:
    one worker started with spawn, which the guard can end if it hangs again. Not persistent: like loading in
    the main process, each epoch reads the dataset as the main process holds it then. pin_memory stays."""
    return Settings(num_workers=1, start_method="spawn", persistent_workers=False, pin_memory=settings.pin_memory)
