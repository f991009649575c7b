"""What the guard costs on a fast pipeline: guarded vs plain DataLoader, measured side by side in one run.

Usage: python benchmarks/guard_overhead.py [ROUNDS]

Each round times one pass of a plain DataLoader and one of the same loader guarded, in alternating order, over
a dataset that returns small tensors (thousands of batches per second, so per-batch costs show). The table gives
the median batches per second of each and the median of the per-round ratios guarded/plain.

A second table gives the start-up: from building the loader and iter() to its first batch, plain and guarded in
alternating order, for each start method with 2 workers, and for a dataset of 200,000,000 samples (the guard's
plan must not grow with the dataset).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import loaderdoctor


class Small(Dataset):
    """A sample of 8 floats: loading costs almost nothing, so the per-batch cost of a wrapper shows in full."""

    def __init__(self, work: int = 0) -> None:
        self.work = work  # extra arithmetic per sample, to reach a few thousand batches per second

    def __len__(self) -> int:
        return 20_000

    def __getitem__(self, index: int) -> torch.Tensor:
        value = float(index)
        for _ in range(self.work):
            value = (value * 1.000001) % 1e6
        return torch.full((8,), value)


def _rate(loader: object) -> float:
    started = time.perf_counter()
    batches = sum(1 for _ in loader)
    return batches / (time.perf_counter() - started)


def _compare(workers: int, work: int, rounds: int) -> tuple[float, float, float]:
    kwargs = {"batch_size": 4, "num_workers": workers}
    if workers:
        kwargs.update(persistent_workers=True, prefetch_factor=8)
    plain = DataLoader(Small(work), **kwargs)
    guarded = loaderdoctor.DataLoader(Small(work), **kwargs)
    _rate(plain), _rate(guarded)  # warm-up: workers started, caches filled
    plain_rates, guarded_rates, ratios = [], [], []
    for round_number in range(rounds):
        order = [(plain, plain_rates), (guarded, guarded_rates)]
        for loader, rates in order if round_number % 2 == 0 else reversed(order):
            rates.append(_rate(loader))
        ratios.append(guarded_rates[-1] / plain_rates[-1])
    guarded.close()
    del plain
    return statistics.median(plain_rates), statistics.median(guarded_rates), statistics.median(ratios)


class Huge(Small):
    def __len__(self) -> int:
        return 200_000_000


def _first_batch_s(make: object) -> float:
    started = time.perf_counter()
    loader = make()  # type: ignore[operator]
    iterator = iter(loader)
    next(iterator)
    elapsed = time.perf_counter() - started  # both iterators still alive: ending workers is timed for neither
    del iterator
    if hasattr(loader, "close"):
        loader.close()
    return elapsed


def _startup(dataset: Dataset, workers: int, method: str | None, rounds: int) -> tuple[float, float]:
    kwargs = {"batch_size": 4, "num_workers": workers, "multiprocessing_context": method}

    def plain() -> DataLoader:
        return DataLoader(dataset, **kwargs)

    def guarded() -> DataLoader:
        return loaderdoctor.DataLoader(dataset, **kwargs)

    times: dict[object, list[float]] = {plain: [], guarded: []}
    for round_number in range(rounds):
        order = [plain, guarded] if round_number % 2 == 0 else [guarded, plain]
        for make in order:
            times[make].append(_first_batch_s(make))
    return statistics.median(times[plain]), statistics.median(times[guarded])


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 7
    header = f"{'pipeline':<28} {'plain batches/s':>16} {'guarded batches/s':>18} {'guarded/plain':>14} {'us added':>9}"
    print(header)
    print("-" * len(header))
    for label, workers, work in (
        ("no work, in the main process", 0, 0),
        ("light work, main process", 0, 1200),
        ("no work, 2 workers", 2, 0),
    ):
        plain, guarded, ratio = _compare(workers, work, rounds)
        added_us = (1 / guarded - 1 / plain) * 1e6
        print(f"{label:<28} {plain:>16.0f} {guarded:>18.0f} {ratio:>14.3f} {added_us:>9.1f}")
    print()
    header = f"{'start-up (to the first batch)':<36} {'plain s':>9} {'guarded s':>10} {'guarded/plain':>14}"
    print(header)
    print("-" * len(header))
    for label, dataset, workers, method in (
        ("main process", Small(), 0, None),
        ("2 workers, fork", Small(), 2, "fork"),
        ("2 workers, forkserver", Small(), 2, "forkserver"),
        ("2 workers, spawn", Small(), 2, "spawn"),
        ("200M samples, main process", Huge(), 0, None),
        ("200M samples, 2 workers, fork", Huge(), 2, "fork"),
    ):
        plain, guarded = _startup(dataset, workers, method, max(3, rounds // 2))
        print(f"{label:<36} {plain:>9.3f} {guarded:>10.3f} {guarded / plain:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
