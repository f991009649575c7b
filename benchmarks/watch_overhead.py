"""What watch() costs a training loop: a plain loop against the same loop over watch(loader), side by side.

Usage: python benchmarks/watch_overhead.py [ROUNDS]

Each round times one epoch of a plain loop and one of the same loop over the watched loader, in alternating
order. The loop's step is a small matrix product (about a millisecond: a fast training step on a CPU); the
pipelines range from a loader that costs almost nothing per batch (so watch's per-batch cost shows in full) to
one that the step outruns. The table gives the median batches per second of each and the median of the
per-round ratios watched/plain; the goal is 0.98 or more on every pipeline.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.watch import watch


class Small(Dataset):
    """A sample of 8 floats, with `work` extra arithmetic per sample."""

    def __init__(self, work: int = 0, size: int = 8_000) -> None:
        self.work, self.size = work, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        value = float(index)
        for _ in range(self.work):
            value = (value * 1.000001) % 1e6
        return torch.full((8,), value)


WEIGHTS = torch.randn(256, 256)


def _step(batch: torch.Tensor) -> None:
    x = WEIGHTS
    for _ in range(4):
        x = x @ WEIGHTS
    del batch, x


def _epoch_rate(loader: object) -> float:
    started = time.perf_counter()
    batches = 0
    for batch in loader:  # type: ignore[attr-defined]
        _step(batch)
        batches += 1
    return batches / (time.perf_counter() - started)


def _compare(workers: int, work: int, rounds: int) -> tuple[float, float, float]:
    kwargs = {"batch_size": 4, "num_workers": workers}
    if workers:
        kwargs.update(persistent_workers=True, prefetch_factor=8)
    plain = DataLoader(Small(work), **kwargs)
    watched = watch(DataLoader(Small(work), **kwargs), "benchmark", history=False)
    _epoch_rate(plain), _epoch_rate(watched)  # warm-up: workers started, caches filled
    plain_rates, watched_rates, ratios = [], [], []
    for round_number in range(rounds):
        order = [(plain, plain_rates), (watched, watched_rates)]
        for loader, rates in order if round_number % 2 == 0 else reversed(order):
            rates.append(_epoch_rate(loader))
        ratios.append(watched_rates[-1] / plain_rates[-1])
    watched.close()
    return statistics.median(plain_rates), statistics.median(watched_rates), statistics.median(ratios)


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 7
    logging.getLogger("loaderdoctor").setLevel(logging.ERROR)  # the diagnosis lines are not the point here
    torch.set_num_threads(1)
    header = f"{'pipeline':<28} {'plain batches/s':>16} {'watched batches/s':>18} {'watched/plain':>14} {'us added':>9}"
    print(header)
    print("-" * len(header))
    for label, workers, work in (
        ("no work, in the main process", 0, 0),
        ("light work, main process", 0, 1200),
        ("no work, 2 workers", 2, 0),
        ("light work, 2 workers", 2, 1200),
    ):
        plain, watched, ratio = _compare(workers, work, rounds)
        added_us = (1 / watched - 1 / plain) * 1e6
        print(f"{label:<28} {plain:>16.0f} {watched:>18.0f} {ratio:>14.3f} {added_us:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
