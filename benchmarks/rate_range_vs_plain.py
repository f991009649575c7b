"""The run's own spread (`batches_per_s_range`: the rate over three stretches of the steady batches, which the
history's `--fail-if-slower` gate weighs a slowdown against) against the spread a plain timer sees in the same loop:
the rate of each third of the run's epochs, by the wall clock.

Usage: python benchmarks/rate_range_vs_plain.py [--rounds N] [--epochs N]

Each round iterates one loader, 2 workers started again every epoch (so each epoch pays its start-up, as the
tool's figures count it), over `epochs` epochs of 24 batches, through watch() (history off), with a 4 ms step;
its samples take 1 ms each, and from the middle third of the run on, 3 ms (the loader slows down during the run,
so that the spread has something to show). The plain figures: the loop's own perf_counter at each epoch's iter()
and end, and each third's batches over its time. The table gives the tool's overall rate and range, the plain
ones, and the ratios. It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor import watch

BATCHES_PER_EPOCH = 24
BATCH_SIZE = 4


class Slowing(Dataset):
    """Samples that take `read_s` each, which the loop raises as the run goes on (read in the workers at each
    epoch's start: they are started again every epoch)."""

    def __init__(self) -> None:
        self.read_s = 0.001

    def __len__(self) -> int:
        return BATCHES_PER_EPOCH * BATCH_SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.read_s)
        return torch.zeros(8)


def one_round(epochs: int) -> tuple[float, tuple[float, float], float, tuple[float, float]]:
    dataset = Slowing()
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=2)
    spans: list[tuple[float, float, int]] = []
    with watch(loader, "bench-range", history=False, log_every_s=3600) as watched:
        for epoch in range(epochs):
            dataset.read_s = 0.001 if epoch < epochs // 3 else 0.003
            began, batches = time.perf_counter(), 0
            for _ in watched:
                time.sleep(0.004)
                batches += 1
            spans.append((began, time.perf_counter(), batches))
    m = watched.report.to_dict()["measurements"]
    third = epochs // 3
    rates = []
    for part in range(3):
        group = spans[part * third : (part + 1) * third]
        rates.append(sum(n for _, _, n in group) / sum(end - start for start, end, _ in group))
    total = sum(n for _, _, n in spans) / sum(end - start for start, end, _ in spans)
    low, high = m["batches_per_s_range"]
    return m["batches_per_s"], (low, high), total, (min(rates), max(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=9)
    args = parser.parse_args()
    logging.getLogger("loaderdoctor").setLevel(logging.ERROR)  # the diagnosis at the watch's end: not printed
    print("| round | tool b/s | tool range | plain b/s | plain range (thirds) | rate | low | high |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for number in range(args.rounds):
        rate, (low, high), plain, (plain_low, plain_high) = one_round(args.epochs)
        print(
            f"| {number + 1} | {rate:.1f} | {low:.1f}-{high:.1f} | {plain:.1f} | {plain_low:.1f}-{plain_high:.1f} | "
            f"{rate / plain:.2f} | {low / plain_low:.2f} | {high / plain_high:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
