"""The search space: which Settings the tuner may try on this host, and what their batches in flight cost."""

from __future__ import annotations

from dataclasses import dataclass

from loaderdoctor.loader.settings import Settings

PREFETCH_FACTORS = (2, 4, 8)
# The worker counts between the powers of two that the grid holds (the tuner reaches them by bisecting).
_BETWEEN = (3, 6, 12, 24, 48)


@dataclass(frozen=True)
class Limits:
    """What the search may use: measured on the host, or given by the user."""

    cores: float  # usable cores (affinity mask and cgroup quota)
    memory_bytes: int  # the memory budget of loading: workers and batches in flight
    shm_bytes: int | None  # free /dev/shm, where batches wait on their way from the workers
    max_workers: int  # never more workers (or threads) than this
    start_method: str | None  # every candidate's start method: fork only where forking is safe
    pin_memory: bool  # an accelerator is there
    threads: bool  # the thread backend can run (torchdata is installed, the dataset is map-style)


def candidate(limits: Limits, num_workers: int, *, prefetch_factor: int = 2, backend: str = "process") -> Settings:
    """The Settings the tuner tries for a worker count: persistent workers (never slower, they only keep their
    memory between epochs), the safe start method, pinned memory with an accelerator."""
    if num_workers == 0:
        return Settings(pin_memory=limits.pin_memory)
    if backend == "thread":
        return Settings(
            num_workers=num_workers, prefetch_factor=prefetch_factor, pin_memory=limits.pin_memory, backend="thread"
        )
    return Settings(
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        persistent_workers=True,
        pin_memory=limits.pin_memory,
        start_method=limits.start_method,
    )


def worker_counts(limits: Limits) -> list[int]:
    """0, 1, 2, 4, ... up to max_workers: the counts the tuner's climb steps through."""
    counts, count = [0], 1
    while count <= limits.max_workers:
        counts.append(count)
        count *= 2
    return counts


def grid(limits: Limits) -> list[Settings]:
    """Every Settings of the space, for an exhaustive search to compare the tuner with: worker counts (powers
    of two and the counts between them), prefetch factors, persistent or not, and threads when they can run."""
    counts = sorted({c for c in worker_counts(limits) + list(_BETWEEN) if c <= limits.max_workers})
    settings = [candidate(limits, 0)]
    for count in counts[1:]:
        for prefetch in PREFETCH_FACTORS:
            persistent = candidate(limits, count, prefetch_factor=prefetch)
            settings += [persistent, persistent.replace(persistent_workers=False)]
            if limits.threads:
                settings.append(candidate(limits, count, prefetch_factor=prefetch, backend="thread"))
    return settings
