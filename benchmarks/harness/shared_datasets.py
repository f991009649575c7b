"""The small datasets several benchmarks share (those of one benchmark stay in it)."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset


class Small(Dataset):
    """A sample of 8 floats, with `work` extra arithmetic per sample: with none, loading costs almost nothing, so
    the per-batch cost of what wraps the loader shows in full."""

    def __init__(self, work: int = 0, size: int = 20_000) -> None:
        self.work, self.size = work, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        value = float(index)
        for _ in range(self.work):
            value = (value * 1.000001) % 1e6
        return torch.full((8,), value)


class LazyOpen(Dataset):
    """Opens its file on first use (a sleep of `open_s`, as an archive's index is read), in whatever process that
    is, so that each new worker pays the open (the h5py pattern: a handle set on the dataset object); then cheap
    samples of 64 floats."""

    def __init__(self, open_s: float, length: int) -> None:
        self.open_s, self.length = open_s, length
        self.handle: str | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.handle is None:
            time.sleep(self.open_s)
            self.handle = "open"
        return torch.full((64,), float(index))


class Waiting(Dataset):
    """Samples of `width` floats that each wait `read_s` on storage (a sleep: the core is free meanwhile); a loop
    may change `read_s` as the run goes on (workers started anew read it at their start)."""

    def __init__(self, read_s: float, length: int, width: int = 64) -> None:
        self.read_s, self.length, self.width = read_s, length, width

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.read_s)
        return torch.full((self.width,), float(index))
