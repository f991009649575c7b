"""Hand-made Recordings for rule tests: healthy by default, each fault one keyword away."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import (
    AliveThread,
    BatchRecord,
    EpochRecord,
    HostFacts,
    IteratorFacts,
    Recording,
    WorkerReading,
)
from loaderdoctor.workers.activity import LockCalls, WorkerActivity, WorkerSite

MIB = 2**20
GIB = 2**30

HEALTHY_SETTINGS = Settings(num_workers=2, persistent_workers=True)
BATCH_BYTES = 8 * 3 * 32 * 32 * 4  # 8 float32 images of 3x32x32: 96 KiB


def make_host(**overrides: Any) -> HostFacts:
    """A 2-core machine with room to spare: /dev/shm 24 GiB free, 20 of 1024 fds open, no strays."""
    facts: dict[str, Any] = {
        "cpu_count": 2,
        "usable_cores": 2.0,
        "affinity_cores": 2,
        "cgroup_cpu_quota": None,
        "shm_free_bytes": 24 * GIB,
        "shm_total_bytes": 32 * GIB,
        "open_fds": 20,
        "fd_soft_limit": 1024,
        "sharing_strategy": "file_descriptor",
        "local_ranks": 1,
        "accelerator": None,
        "stray_workers": [],
    }
    facts.update(overrides)
    return HostFacts(**facts)


def make_iterators(
    epochs: int,
    start_method: str | None = "fork",
    threads: list[str] | None = None,
    cuda_initialized: bool = False,
    compiled_frames: int = 0,
    native_threads: int = 0,
) -> list[IteratorFacts]:
    """One iterator per epoch, each created with the same state of the main process (threads by name)."""
    return [
        IteratorFacts(
            epoch=e,
            start_method=start_method,
            threads=[AliveThread(name, "") for name in threads or []],
            native_threads=native_threads,
            cuda_initialized=cuda_initialized,
            compiled_frames=compiled_frames,
        )
        for e in range(epochs)
    ]


def make_worker_samples(
    pids: list[int],
    wall_s: float,
    *,
    every_s: float = 0.25,
    cpu_share: float = 0.8,
    threads: int = 2,
    uss_mb_at: Callable[[float], float] = lambda t: 200.0,
) -> list[WorkerReading]:
    """Samples of each worker every `every_s` over the run: CPU time at `cpu_share`, USS as `uss_mb_at(t)`."""
    count = max(2, int(wall_s / every_s) + 1)
    times = [wall_s * i / (count - 1) for i in range(count)]
    return [
        WorkerReading(
            t_s=t,
            pid=pid,
            uss_bytes=int(uss_mb_at(t) * MIB),
            rss_bytes=int((uss_mb_at(t) + 100) * MIB),
            cpu_s=cpu_share * t,
            threads=threads,
        )
        for t in times
        for pid in pids
    ]


def make_recording(
    *,
    settings: Settings = HEALTHY_SETTINGS,
    start_method: str | None = "fork",
    step_s: float | None = 0.05,
    epochs: int = 2,
    batches_per_epoch: int = 20,
    wait_s: float = 0.001,
    wait_cpu_share: float = 0.9,
    first_batch_s: float | list[float] = 0.05,
    batch_bytes: int = BATCH_BYTES,
    batch_size: int = 8,
    worker_pids: list[list[int]] | None = None,
    cpu_share: float = 0.8,
    threads_per_worker: int = 2,
    uss_mb_at: Callable[[float], float] = lambda t: 200.0,
    host: HostFacts | None = None,
    iterators: list[IteratorFacts] | None = None,
    worker_samples: list[WorkerReading] | None = None,
    batches: list[BatchRecord] | None = None,
    wall_s: float | None = None,
    **fields: Any,
) -> Recording:
    """A Recording of `epochs` epochs of `batches_per_epoch` batches; every unset fact is a healthy one.

    Each epoch's first batch waits `first_batch_s` (one value, or one per epoch); the others wait `wait_s`.
    Workers keep their pids across epochs when persistent, and get new ones each epoch otherwise.
    `fields` sets any other Recording field (stall, sample_errors, pickled_dataset_bytes, ...).
    """
    workers = settings.num_workers
    firsts = first_batch_s if isinstance(first_batch_s, list) else [first_batch_s] * epochs
    step = step_s or 0.0
    if batches is None:
        batches = [
            BatchRecord(
                epoch=e,
                index=i,
                wait_s=firsts[e] if i == 0 else wait_s,
                wait_cpu_s=(firsts[e] if i == 0 else wait_s) * wait_cpu_share if workers == 0 else 0.0,
                step_s=step,
                nbytes=batch_bytes,
                samples=batch_size,
            )
            for e in range(epochs)
            for i in range(batches_per_epoch)
        ]
    # One timeline: each batch delivered after its wait, each epoch begun where the one before ended.
    clock, epoch_starts = 0.0, {}
    for batch in batches:
        epoch_starts.setdefault(batch.epoch, clock)
        clock += batch.wait_s
        batch.delivered_s = clock
        clock += batch.step_s
    if wall_s is None:
        wall_s = sum(b.wait_s + b.step_s for b in batches)
    if worker_pids is None:
        worker_pids = [
            [1000 + w + (0 if settings.persistent_workers else 100 * e) for w in range(workers)] for e in range(epochs)
        ]
    if worker_samples is None:
        pids = sorted({pid for epoch_pids in worker_pids for pid in epoch_pids})
        worker_samples = make_worker_samples(
            pids, wall_s, cpu_share=cpu_share, threads=threads_per_worker, uss_mb_at=uss_mb_at
        )
    epoch_records = [
        EpochRecord(
            epoch=e,
            first_batch_s=firsts[e],
            batches=sum(1 for b in batches if b.epoch == e),
            wall_s=sum(b.wait_s + b.step_s for b in batches if b.epoch == e),
            worker_pids=worker_pids[e],
            ended="exhausted",
            started_s=epoch_starts.get(e, 0.0),
        )
        for e in range(epochs)
    ]
    effective_start = start_method if workers else None
    return Recording(
        settings=settings,
        start_method=effective_start,
        batch_size=batch_size,
        batches_per_epoch=batches_per_epoch,
        iterable=False,
        step_s=step_s,
        budget_s=max(10.0, wall_s),
        host=host or make_host(),
        iterators=iterators if iterators is not None else make_iterators(epochs, effective_start),
        epochs=epoch_records,
        batches=batches,
        worker_samples=worker_samples,
        wall_s=wall_s,
        **fields,
    )


POSES = "/data/pipeline/poses.py"  # a dataset's file outside the current directory: shown as it is


def make_activity(
    *,
    lock: str = "fcntl.flock",
    lock_wall_s: float = 7.3,
    lock_cpu_s: float = 0.1,
    lock_samples: int = 730,
    sampled_s: float = 10.5,
    idle_s: float = 0.5,
    lock_calls: LockCalls | None = None,
    lock_free: bool = False,
) -> WorkerActivity:
    """4 workers sampled 10.5 s in all, 0.5 s of it idle for work: 7.3 s at a lock line (0.1 s of CPU), the
    rest reading (sleeping) at the next line; by default 680 exclusive lock calls on read-only files."""
    return WorkerActivity(
        workers=4,
        sampled_s=sampled_s,
        idle_s=idle_s,
        cpu_s=0.2,
        samples=int(sampled_s * 100),
        sites=[
            WorkerSite(POSES, 57, "__getitem__", lock, lock_wall_s, lock_cpu_s, lock_samples, workers=4),
            WorkerSite(POSES, 60, "__getitem__", None, 2.5, 0.05, 250, workers=4),
        ],
        lock_calls=lock_calls if lock_calls is not None else LockCalls(read_only_exclusive=680),
        lock_free=lock_free,
    )
