"""What sampling the workers costs a training loop: a plain loop against the same loop while check's poller reads
its workers, with the rounds spaced by their cost (as now) and every 0.25 s whatever they cost (as before).

Usage: python benchmarks/sampler_cost.py [ROUNDS] [GIB]

A dataset held in memory (GIB GiB, 2 by default: a dataset read whole into RAM), six persistent workers forked
from it, each sample 2 ms of CPU, a training step of 5 ms of CPU. Reading a worker's USS makes the kernel walk
its pages, in the sampling process: about 30 ms a round per such worker here. Each round times one epoch of each
of the three, the order turning by one every round so that a drift on the machine favours none. The table gives
the median batches per second of each and the median of the per-round ratios to the plain loop; the goal is
0.95 or more for the sampled loop as now. Run it on an otherwise quiet machine.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import sys
import time
from collections.abc import Iterator

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.workers import poller as sampling
from loaderdoctor.workers.poller import WorkerPoller


class InMemory(Dataset):
    """Rows of a tensor of `gib` GiB held in memory; each sample takes 2 ms of CPU."""

    def __init__(self, gib: float, size: int = 1024) -> None:
        self.data = torch.ones(int(gib * 2**30) // 4 // 1024, 1024)
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        row = self.data[index * 97 % len(self.data)]
        spent = time.thread_time() + 0.002
        while time.thread_time() < spent:
            pass
        return row[:64].clone()


def _epoch_rate(loader: DataLoader) -> float:
    started = time.perf_counter()
    batches = 0
    for _ in loader:
        spent = time.perf_counter() + 0.005
        while time.perf_counter() < spent:
            pass
        batches += 1
    return batches / (time.perf_counter() - started)


@contextlib.contextmanager
def _sampled(share: float) -> Iterator[WorkerPoller]:
    """check's poller over this process's workers, every 0.25 s at most `share` of a core."""
    own = psutil.Process()
    previous = sampling.MAX_SAMPLING_SHARE
    sampling.MAX_SAMPLING_SHARE = share
    poller = WorkerPoller(lambda: [child.pid for child in own.children()]).start()
    try:
        yield poller
    finally:
        poller.stop()
        sampling.MAX_SAMPLING_SHARE = previous


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 5
    gib = float(argv[1]) if len(argv) > 1 else 2.0
    logging.getLogger("loaderdoctor").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    loader = DataLoader(InMemory(gib), batch_size=4, num_workers=6, persistent_workers=True)
    _epoch_rate(loader)  # warm-up: the workers started
    kinds = {"plain": None, "sampled, spaced by cost": sampling.MAX_SAMPLING_SHARE, "every 0.25 s": float("inf")}
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    rounds_taken: dict[str, list[int]] = {kind: [] for kind in kinds}
    for number in range(rounds):
        names = list(kinds)
        for kind in names[number % 3 :] + names[: number % 3]:
            share = kinds[kind]
            if share is None:
                rates[kind].append(_epoch_rate(loader))
                continue
            with _sampled(share) as poller:
                rates[kind].append(_epoch_rate(loader))
            rounds_taken[kind].append(len(poller.host_readings))
    del loader
    print(f"six workers forked from {gib:g} GiB held in memory; {rounds} rounds, one epoch of each per round")
    print(f"{'loop':<26} {'batches/s':>10} {'of plain':>9} {'rounds of samples':>18}")
    plain = rates["plain"]
    for kind, measured in rates.items():
        ratio = statistics.median(r / p for r, p in zip(measured, plain, strict=True))
        taken = f"{statistics.median(rounds_taken[kind]):.0f}" if rounds_taken[kind] else "-"
        print(f"{kind:<26} {statistics.median(measured):>10.1f} {ratio:>9.2f} {taken:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
