"""Datasets that many tests load, one definition each: `from shared_datasets import Pairs` in any test folder (pyproject
puts tests/ on pytest's pythonpath, and multiprocessing passes that path on to spawned and forkserver workers)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, IterableDataset


class Pairs(Dataset):
    """Sample i is (a tensor of `width` times i, the int i): collation stacks the one and tensorises the other."""

    def __init__(self, n: int, width: int = 3) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((self.width,), float(index)), index


class PlusMinus(Dataset):
    """Sample i is the tensor [i, -i]; the listed indices raise ValueError."""

    def __init__(self, n: int, bad: tuple[int, ...] = ()) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in self.bad:
            raise ValueError(f"bad sample {index}")
        return torch.tensor([float(index), -float(index)])


class Indices(Dataset):
    """Sample i is the int i: batches show which indices they hold."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class Squares(Dataset):
    """Sample i is i * i: the int, or a tensor of `width` times it."""

    def __init__(self, n: int, width: int | None = None) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int | torch.Tensor:
        square = index * index
        return square if self.width is None else torch.full((self.width,), float(square))


class Stream(IterableDataset):
    """0 .. n-1 without a len(): the ints, or a tensor of `width` times each; no state_dict(), so not resumable."""

    def __init__(self, n: int, width: int | None = None) -> None:
        self.n, self.width = n, width

    def __iter__(self) -> Iterator[int | torch.Tensor]:
        for i in range(self.n):
            yield i if self.width is None else torch.full((self.width,), float(i))


class Busy(Dataset):
    """Each sample costs `ms` of CPU in the process that loads it; sample i is (a tensor of 8 times i, a zero
    target), as a model's training step takes it."""

    def __init__(self, ms: float, size: int = 400) -> None:
        self.ms, self.size = ms, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        until = time.perf_counter() + self.ms / 1000
        while time.perf_counter() < until:
            pass
        return torch.full((8,), float(index)), torch.zeros(1)


class Crunch(Dataset):
    """Pure computing: about 40 ms of CPU a sample (the thread's own CPU time), nothing to wait for."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        total = 0.0
        deadline = time.thread_time() + 0.04
        while time.thread_time() < deadline:
            total += 1.0
        return torch.tensor([total])


class OpensLazily(Dataset):
    """Opens its "file" on first use, wherever that is (the h5py pattern): a handle set on the object, `open_s` of
    waiting for it, and a count of opens; the data itself is one tensor that a copy of the object shares."""

    def __init__(self, n: int = 16, open_s: float = 0.0) -> None:
        self.n, self.open_s = n, open_s
        self.data = torch.arange(n, dtype=torch.float32)
        self.handle: str | None = None
        self.opened = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.handle is None:
            time.sleep(self.open_s)
            self.handle = "open"
            self.opened += 1
        return self.data[index : index + 1]
