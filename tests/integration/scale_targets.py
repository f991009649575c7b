"""Targets for the scale tests, built in each rank as a user's `file.py:function` is: loaders whose ranks
hang, die, or take different numbers of steps."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from loaderdoctor.loader.workload import Workload


class Numbers(Dataset):
    """Small tensors; on `bad_rank` the sample `hang_at` sleeps far beyond any stall threshold."""

    def __init__(self, count: int, hang_at: int | None = None) -> None:
        self.count = count
        self.hang_at = hang_at

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.hang_at:
            time.sleep(3600)
        return torch.full((16,), float(index))


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def hangs_on_rank_1() -> Workload:
    """Rank 1's worker hangs on a sample of its second epoch: its own watchdog must name it, and the other
    rank must not wait forever."""
    dataset = Numbers(64, hang_at=33 if _rank() == 1 else None)  # rank 1 gets the odd indices: 33 is its 17th
    sampler = DistributedSampler(dataset, shuffle=False)
    return Workload(DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=1), step_ms=5)


def killed_on_rank_1() -> Workload:
    """Rank 1's process is killed (as the OOM killer does) after a few steps."""
    dataset = Numbers(256)
    sampler = DistributedSampler(dataset, shuffle=False)
    steps = {"n": 0}

    def step(batch: torch.Tensor) -> None:
        steps["n"] += 1
        if _rank() == 1 and steps["n"] == 10:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.005)

    return Workload(DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=1), step=step)


class SlowReads(Numbers):
    """Numbers read from storage that takes `read_s` a sample."""

    def __init__(self, count: int, read_s: float) -> None:
        super().__init__(count)
        self.read_s = read_s

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.read_s)
        return super().__getitem__(index)


def slow_storage_on_rank_1() -> Workload:
    """Rank 1 reads its samples from slow storage (30 ms each, 120 ms a batch); rank 0's are at hand."""
    dataset = SlowReads(256, 0.03 if _rank() == 1 else 0.0)
    sampler = DistributedSampler(dataset, shuffle=False)
    return Workload(DataLoader(dataset, batch_size=4, sampler=sampler), step_ms=20)


def uneven_steps() -> Workload:
    """Rank 0 takes one more batch per epoch than the others (a stream split unevenly)."""
    count = 40 if _rank() == 0 else 36
    return Workload(DataLoader(Numbers(count), batch_size=4), step_ms=2)


def light_ddp() -> Workload:
    """A healthy DDP loader: a DistributedSampler and one worker per rank, far ahead of a 50 ms step."""
    dataset = Numbers(512)
    sampler = DistributedSampler(dataset, shuffle=True)
    return Workload(DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=1, persistent_workers=True))


def raises() -> Workload:
    """A user's function that fails in every rank."""
    raise RuntimeError("no data here")
