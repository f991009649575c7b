"""What the search's budgets rule out before a trial runs: batches in flight that would fill /dev/shm, and memory
predicted over the budget from the workers measured so far."""

from __future__ import annotations

from loaderdoctor.loader.settings import Settings
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.trial import Trial


def refused(
    settings: Settings, limits: Limits, batch_bytes: int | None, measured: list[Trial]
) -> tuple[str, str] | None:
    """(verdict, why) when the budgets rule `settings` out before it runs; `measured` are the search's process
    trials with workers so far, `batch_bytes` a batch's size when known."""
    in_flight = None if batch_bytes is None else settings.batches_in_flight * batch_bytes
    shm = limits.shm_bytes
    uses_shm = settings.backend == "process" and settings.num_workers > 0
    if uses_shm and in_flight is not None and shm is not None and in_flight > shm / 2:
        return "over-shm", f"{mb(in_flight)} of batches in flight would fill /dev/shm ({mb(shm)} free)"
    predicted = predicted_memory(settings, batch_bytes, measured)
    if predicted is not None and predicted > limits.memory_bytes:
        return "over-memory", (
            f"predicted {mb(predicted)} from the workers measured so far, over the memory budget of "
            f"{mb(limits.memory_bytes)}"
        )
    return None


def predicted_memory(settings: Settings, batch_bytes: int | None, measured: list[Trial]) -> int | None:
    """Memory of `settings` from the most any measured worker used, plus its batches in flight."""
    if settings.backend != "process" or not settings.num_workers:
        return None
    per_worker = []
    for trial in measured:
        workers, memory = trial.settings.num_workers, trial.memory_bytes
        if workers and memory is not None:
            measured_in_flight = trial.settings.batches_in_flight * (batch_bytes or 0)
            per_worker.append(max(0, memory - measured_in_flight) / workers)
    if not per_worker:
        return None
    return int(max(per_worker) * settings.num_workers + settings.batches_in_flight * (batch_bytes or 0))


def mb(size: float) -> str:
    return f"{size / 2**20:.0f} MB"
