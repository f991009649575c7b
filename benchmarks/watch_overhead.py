"""What watch() costs a training loop: a plain loop against the same loop over watch(loader), side by side.

Usage: python benchmarks/watch_overhead.py [ROUNDS]

Each round times one epoch of a plain loop and one of the same loop over the watched loader, in alternating
order. The loop's step is a small matrix product (about a millisecond: a fast training step on a CPU); the
pipelines range from a loader that costs almost nothing per batch (so watch's per-batch cost shows in full) to
one that the step outruns. The table gives the median batches per second of each and the median of the
per-round ratios watched/plain; the goal is 0.98 or more on every pipeline.
"""

from __future__ import annotations

import functools
import logging
import sys

import torch
from torch.utils.data import DataLoader

import harness
from harness.shared_datasets import Small
from loaderdoctor.watch import watch

WEIGHTS = torch.randn(256, 256)
PIPELINES = (
    ("no work, in the main process", 0, 0),
    ("light work, main process", 0, 1200),
    ("no work, 2 workers", 2, 0),
    ("light work, 2 workers", 2, 1200),
)


def _step(batch: torch.Tensor) -> None:
    x = WEIGHTS
    for _ in range(4):
        x = x @ WEIGHTS
    del batch, x


def _compare(workers: int, work: int, rounds: int) -> tuple[float, float, float]:
    kwargs = {"batch_size": 4, "num_workers": workers}
    if workers:
        kwargs.update(persistent_workers=True, prefetch_factor=8)
    plain = DataLoader(Small(work, size=8_000), **kwargs)
    watched = watch(DataLoader(Small(work, size=8_000), **kwargs), "benchmark", history=False)
    harness.loop_rate(plain, _step), harness.loop_rate(watched, _step)  # warm-up: workers started, caches filled
    measured = harness.side_by_side(
        functools.partial(harness.loop_rate, plain, _step), functools.partial(harness.loop_rate, watched, _step), rounds
    )
    watched.close()
    return measured


def main(argv: list[str]) -> int:
    args = harness.parser(__doc__, rounds=7, rounds_as="ROUNDS").parse_args(argv)
    logging.getLogger("loaderdoctor").setLevel(logging.ERROR)  # the diagnosis lines are not the point here
    torch.set_num_threads(1)
    with harness.Results(__file__, args) as results:
        table = harness.OverheadTable(results, "pipeline", 28, "batches/s", "watched")
        table.header()
        for label, workers, work in PIPELINES:
            table.add(label, *_compare(workers, work, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
