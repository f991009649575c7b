"""The plain side of the two-rank ceiling benchmarks (job_ceiling_vs_plain.py, dispatch_ceiling_vs_plain.py): a
rank's loop in turns of 3 s (real, cached, real, cached, real), the cached turns stepping on the last batch the
loader delivered without asking it for more; rank 0's clock decides the turn and an all_reduce tells every rank, so
all switch at the same step. Imported by the ranks' scripts (`from harness.ranks import turns`), which those
benchmarks write to a folder of their own and run with benchmarks/ on PYTHONPATH."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

TURN_S = 3.0
BENCHMARKS = str(Path(__file__).resolve().parents[1])  # for the ranks' PYTHONPATH: benchmarks/


def turns(loader: Iterable[Any], step: Callable[[Any], None], *, warm_up: int = 10) -> tuple[float, float]:
    """The rank's steps per second in its real turns and in its cached ones, each the mean over its turns."""
    batches = iter(loader)
    last = next(batches)
    for _ in range(warm_up):
        step(last)
        last = next(batches)
    rates: dict[int, list[float]] = {0: [], 1: []}
    for turn in range(5):
        started, steps = time.perf_counter(), 0
        while True:
            go_on = torch.tensor([1.0 if time.perf_counter() - started < TURN_S else 0.0])
            dist.all_reduce(go_on, op=dist.ReduceOp.MIN)
            if go_on.item() == 0.0:
                break
            if turn % 2 == 0:
                last = next(batches)
            step(last)
            steps += 1
        rates[turn % 2].append(steps / (time.perf_counter() - started))
    return sum(rates[0]) / len(rates[0]), sum(rates[1]) / len(rates[1])
