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

import logging
import time

from torch.utils.data import DataLoader

import harness
from harness.shared_datasets import Waiting
from loaderdoctor import watch

BATCHES_PER_EPOCH = 24
BATCH_SIZE = 4


def one_round(epochs: int) -> tuple[float, tuple[float, float], float, tuple[float, float]]:
    # samples that take `read_s` each, which the loop raises as the run goes on (read in the workers at each
    # epoch's start: they are started again every epoch)
    dataset = Waiting(0.001, BATCHES_PER_EPOCH * BATCH_SIZE, width=8)
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


COLUMNS = [
    harness.Column("round"),
    harness.Column("tool b/s", fmt=".1f"),
    harness.Column("tool range"),
    harness.Column("plain b/s", fmt=".1f"),
    harness.Column("plain range (thirds)"),
    harness.Column("rate", fmt=".2f", key="rate_ratio"),
    harness.Column("low", fmt=".2f", key="low_ratio"),
    harness.Column("high", fmt=".2f", key="high_ratio"),
]


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__doc__, rounds=3)
    parser.add_argument("--epochs", type=int, default=9)
    args = parser.parse_args(argv)
    logging.getLogger("loaderdoctor").setLevel(logging.ERROR)  # the diagnosis at the watch's end: not printed
    table = harness.Table(COLUMNS, markdown=True)
    with harness.Results(__file__, args) as results:
        table.header()
        for number in range(args.rounds):
            rate, (low, high), plain, (plain_low, plain_high) = one_round(args.epochs)
            ranges = f"{low:.1f}-{high:.1f}", f"{plain_low:.1f}-{plain_high:.1f}"
            row = table.row(
                number + 1, rate, ranges[0], plain, ranges[1], rate / plain, low / plain_low, high / plain_high
            )
            results.add(**row)
        for key in ("rate_ratio", "low_ratio", "high_ratio"):
            results.figures[f"tool/plain, {key.split('_')[0]}"] = harness.median(r[key] for r in results.rows)


if __name__ == "__main__":
    main()
