"""Five data pipelines of different character, for comparing DataLoader settings tuners (used by benchmarks/tune.py).

Usage: python benchmarks/tune_pipelines.py   (lists the pipelines and times one epoch of each at default settings)

Each entry of PIPELINES is a function returning a fresh torch.utils.data.DataLoader with PyTorch's default settings
(num_workers=0, no persistent workers); a tuner is expected to change those settings and measure. The datasets are
module-level classes whose state pickles cheaply, so they work with the fork, forkserver and spawn start methods,
and every sample is a pure function of its index (no randomness), so epochs are repeatable. The costs were tuned on
a 2-core machine so that one epoch takes roughly 0.3-1.5 s at the best settings; CPU costs are loop counts, so they
scale with the machine, while the sleeps do not.

    python-cpu      pure-Python work holding the GIL: process workers about the core count win, threads do not help
    numpy-gil-free  numpy work releasing the GIL: workers about the core count win, threads as good as processes
    io-latency      sleeps standing in for storage latency: many workers (8-32), far beyond the core count, win
    costly-startup  each process pays ~1 s before its first sample: persistent_workers=True wins
    memory-heavy    64 MB batches with light work: few workers and a small prefetch win (batches in flight cost memory)
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def _lcg(seed: int, rounds: int) -> int:
    """Pure-Python integer work (a linear congruential generator), about 0.13 µs per round; holds the GIL."""
    state, total = seed & 0x7FFFFFFF, 0
    for _ in range(rounds):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        total += state >> 16
    return total


class PythonCpu(Dataset):
    """A sample is `rounds` rounds of pure-Python arithmetic (about 2.6 ms holding the GIL), returned as 16 floats."""

    def __init__(self, length: int = 384, rounds: int = 20_000) -> None:
        self.length, self.rounds = length, rounds

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        total = _lcg(index + 1, self.rounds)
        return torch.tensor([(total >> shift) & 0xFFFF for shift in range(0, 64, 4)], dtype=torch.float32)


class NumpyGilFree(Dataset):
    """A sample is a chain of numpy ufuncs over `size` float64 values (about 2.5 ms, GIL released), pooled to floats."""

    def __init__(self, length: int = 384, size: int = 120_000) -> None:
        self.length, self.size = length, size

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        x = np.linspace(0.0, 1.0 + index % 97, self.size)
        y = np.exp(np.sin(x * 3.0 + 1.0) * 0.5) + np.cos(x)
        return torch.from_numpy(y.reshape(-1, 1000).mean(axis=1).astype(np.float32))


class IoLatency(Dataset):
    """A sample waits `latency_s` (time.sleep, as a read from remote storage would) and returns 64 floats."""

    def __init__(self, length: int = 800, latency_s: float = 0.006) -> None:
        self.length, self.latency_s = length, latency_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.latency_s)
        return torch.arange(64, dtype=torch.float32) + index


class CostlyStartup(Dataset):
    """On first use in each process, opens a table (sleep) and builds an index (Python CPU); then ~2 ms per sample."""

    def __init__(
        self, length: int = 384, open_s: float = 0.6, build_rounds: int = 3_000_000, rounds: int = 15_000
    ) -> None:
        self.length, self.open_s, self.build_rounds, self.rounds = length, open_s, build_rounds, rounds
        self._table: list[int] | None = None
        self._table_pid: int | None = None  # the table is per process, like a database connection: not shared

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_table": None, "_table_pid": None}

    def _table_here(self) -> list[int]:
        if self._table is None or self._table_pid != os.getpid():
            time.sleep(self.open_s)
            chunk = self.build_rounds // 256
            self._table = [_lcg(seed, chunk) & 0xFFFF for seed in range(256)]
            self._table_pid = os.getpid()
        return self._table

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        table = self._table_here()
        total = _lcg(table[index % 256] + index, self.rounds)
        return torch.tensor([(total >> shift) & 0xFFFF for shift in range(0, 32, 4)], dtype=torch.float32)


class MemoryHeavy(Dataset):
    """A sample is an 8 MB float32 frame (1024 x 2048), a ramp offset by its index: big to move, cheap to make."""

    def __init__(self, length: int = 256, height: int = 1024, width: int = 2048) -> None:
        self.length, self.height, self.width = length, height, width

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        frame = np.empty((self.height, self.width), dtype=np.float32)
        frame[...] = np.arange(self.width, dtype=np.float32)  # one write pass over the 8 MB
        frame += np.float32(index)  # one read-modify-write pass
        return torch.from_numpy(frame)


def python_cpu() -> DataLoader:
    """Pure-Python CPU work per sample (parsing, tokenising, Python augmentations): ~2.6 ms holding the GIL.

    Should win: process workers about the core count (here 2), not many more since each worker is CPU bound and the
    main process needs a little CPU too; a thread backend gains nothing because the GIL serialises the work.
    384 samples in 48 batches of 8: about 1 s per epoch at num_workers=0 and about half that at the best settings.
    """
    return DataLoader(PythonCpu(), batch_size=8)


def numpy_gil_free() -> DataLoader:
    """Numpy work per sample that releases the GIL (decoding, resizing, array augmentations): ~2.5-3 ms of ufuncs.

    Should win: workers about the core count; threads about as fast as processes, since numpy ufuncs release the
    GIL. The work is elementwise ufuncs only (no BLAS, FFT or torch ops), which numpy runs on one thread, so no
    thread-pool limits are needed inside __getitem__ and the main process' torch/BLAS thread settings are untouched.
    384 samples in 48 batches of 8: about 1 s per epoch at num_workers=0 and about 0.5 s at the best settings.
    """
    return DataLoader(NumpyGilFree(), batch_size=8)


def io_latency() -> DataLoader:
    """Latency-bound loading (object storage, network file systems): each sample waits 6 ms with almost no CPU.

    Should win: many workers, far beyond the core count (8-32), since a waiting worker costs no CPU; a batch of 8
    takes ~48 ms, so N workers give up to N/0.048 batches/s until per-batch overheads or start-up dominate. Threads
    do as well as processes and start faster. 800 samples in 100 batches: ~5 s per epoch at num_workers=0.
    """
    return DataLoader(IoLatency(), batch_size=8)


def costly_startup() -> DataLoader:
    """Each process pays ~1 s before its first sample (0.6 s opening a table, ~0.4 s CPU building an index).

    Models datasets that open per-process handles (databases, archives, HDF5/LMDB files) or build lookup tables
    lazily; the table is rebuilt whenever the process id changes, so forked workers do not inherit the parent's.
    Per-sample work is moderate (~2 ms of Python) and epochs are short (384 samples in 48 batches of 8: ~0.8 s at
    num_workers=0, ~0.4 s with 2 workers), so with persistent_workers=False every epoch pays the start-up again and
    is slower than num_workers=0. Should win: persistent_workers=True with workers about the core count; many workers
    add start-up CPU (0.4 s each, on the shared cores) to the first epoch.
    """
    return DataLoader(CostlyStartup(), batch_size=8)


def memory_heavy() -> DataLoader:
    """Large samples with light work (video frames, volumes, raw images): 8 MB per sample, 64 MB per batch of 8.

    Should win: few workers (about the core count) and a small prefetch. The work is memory bandwidth, which more
    workers do not add: 8-16 workers are 2-3x slower than 2, and one worker is no faster than none. Every batch in
    flight costs num_workers * prefetch_factor * 64 MB of memory and /dev/shm (16 workers with the default
    prefetch_factor=2 peak near 2 GB of /dev/shm), while prefetch_factor=1 is as fast as 2 or 4 with 2 workers.
    256 samples in 32 batches: about 2 GB made per epoch, ~1.2 s at the best settings.
    """
    return DataLoader(MemoryHeavy(), batch_size=8)


PIPELINES: dict[str, Callable[[], DataLoader]] = {
    "python-cpu": python_cpu,
    "numpy-gil-free": numpy_gil_free,
    "io-latency": io_latency,
    "costly-startup": costly_startup,
    "memory-heavy": memory_heavy,
}

SUMMARIES: dict[str, str] = {
    "python-cpu": "pure-Python work holding the GIL (~2.6 ms/sample): process workers about the core count",
    "numpy-gil-free": "numpy ufuncs releasing the GIL (~2.5 ms/sample): workers about the core count, threads as good",
    "io-latency": "6 ms sleep per sample, little CPU: many workers (8-32), far beyond the core count",
    "costly-startup": "~1 s start-up per process, ~2 ms/sample, short epochs: persistent_workers=True",
    "memory-heavy": "8 MB samples, 64 MB batches, light work: few workers, small prefetch",
}


def main(argv: list[str] | None = None) -> int:
    import harness  # here, not above: the workers that unpickle these datasets import this module

    args = harness.parser(__doc__).parse_args(argv)
    with harness.Results(__file__, args) as results:
        for name, make in PIPELINES.items():
            loader = make()
            seconds = len(loader) / harness.loop_rate(loader)
            print(f"{name:<15} {len(loader):>4} batches, {seconds:5.2f} s at defaults  {SUMMARIES[name]}")
            results.add(pipeline=name, batches=len(loader), seconds=seconds)
            results.figures[f"{name}: s an epoch at defaults"] = seconds
    return 0


if __name__ == "__main__":
    sys.exit(main())
