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

import functools
import statistics
import sys
import time
from collections.abc import Callable

from torch.utils.data import DataLoader, Dataset

import harness
import loaderdoctor
from harness import Column, Table
from harness.shared_datasets import Small

PIPELINES = (
    ("no work, in the main process", 0, 0),
    ("light work, main process", 0, 1200),
    ("no work, 2 workers", 2, 0),
)


def _compare(workers: int, work: int, rounds: int) -> tuple[float, float, float]:
    kwargs = {"batch_size": 4, "num_workers": workers}
    if workers:
        kwargs.update(persistent_workers=True, prefetch_factor=8)
    plain = DataLoader(Small(work), **kwargs)
    guarded = loaderdoctor.DataLoader(Small(work), **kwargs)
    harness.loop_rate(plain), harness.loop_rate(guarded)  # warm-up: workers started, caches filled
    measured = harness.side_by_side(
        functools.partial(harness.loop_rate, plain), functools.partial(harness.loop_rate, guarded), rounds
    )
    guarded.close()
    return measured


class Huge(Small):
    def __len__(self) -> int:
        return 200_000_000


def _first_batch_s(make: Callable[[], DataLoader]) -> float:
    started = time.perf_counter()
    loader = make()
    iterator = iter(loader)
    next(iterator)
    elapsed = time.perf_counter() - started  # both iterators still alive: ending workers is timed for neither
    del iterator
    if hasattr(loader, "close"):
        loader.close()
    return elapsed


def _startup(dataset: Dataset, workers: int, method: str | None, rounds: int) -> tuple[float, float]:
    kwargs = {"batch_size": 4, "num_workers": workers, "multiprocessing_context": method}

    def plain() -> float:
        return _first_batch_s(lambda: DataLoader(dataset, **kwargs))

    def guarded() -> float:
        return _first_batch_s(lambda: loaderdoctor.DataLoader(dataset, **kwargs))

    measured = list(harness.in_turns({"plain": plain, "guarded": guarded}, rounds))
    return statistics.median(r["plain"] for r in measured), statistics.median(r["guarded"] for r in measured)


def main(argv: list[str]) -> int:
    args = harness.parser(__doc__, rounds=7, rounds_as="ROUNDS").parse_args(argv)
    with harness.Results(__file__, args) as results:
        table = harness.OverheadTable(results, "pipeline", 28, "batches/s", "guarded")
        table.header()
        for label, workers, work in PIPELINES:
            table.add(label, *_compare(workers, work, args.rounds))
        print()
        columns = [Column("start-up (to the first batch)", 36, align="<"), Column("plain s", 9, ".3f")]
        table = Table([*columns, Column("guarded s", 10, ".3f"), Column("guarded/plain", 14, ".2f")])
        table.header()
        for label, dataset, workers, method in (
            ("main process", Small(), 0, None),
            ("2 workers, fork", Small(), 2, "fork"),
            ("2 workers, forkserver", Small(), 2, "forkserver"),
            ("2 workers, spawn", Small(), 2, "spawn"),
            ("200M samples, main process", Huge(), 0, None),
            ("200M samples, 2 workers, fork", Huge(), 2, "fork"),
        ):
            plain, guarded = _startup(dataset, workers, method, max(3, args.rounds // 2))
            table.row(label, plain, guarded, guarded / plain)
            results.add(start_up=label, plain_s=plain, guarded_s=guarded, ratio=guarded / plain)
            results.figures[f"start-up, {label}: guarded/plain"] = guarded / plain
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
