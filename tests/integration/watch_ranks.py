"""A plain training loop of two CPU processes under torchrun (gloo), for test_trainer_ranks.py: each rank trains a
linear model on its share of a starved map-style dataset (DistributedSampler), its gradients averaged by an
all_reduce a step, through watch(loader, ceiling=9); rank 1 is a straggler (each of its steps 10 ms longer). As
such scripts do, the process group is destroyed before the watch ends; each rank then closes its watch and writes
what it measured to rank<N>.json in the output folder.

    python -m torch.distributed.run --standalone --nproc-per-node 2 watch_ranks.py OUT
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ranks_written import Slow, write_rank
from torch.utils.data import DataLoader, DistributedSampler

import loaderdoctor


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loader = DataLoader(Slow(), batch_size=4, sampler=DistributedSampler(Slow(), shuffle=False))
    watched = loaderdoctor.watch(loader, "ranks", ceiling=9, history=False)
    seen = []
    for batch in watched:
        seen.append(batch[:, 0].int().tolist())
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        for parameter in model.parameters():  # the step's collective: the ranks meet here
            dist.all_reduce(parameter.grad)
        time.sleep(0.010 * rank)
    dist.destroy_process_group()
    report = watched.close()
    assert report is not None
    write_rank(out / f"rank{rank}.json", report, seen=seen)


if __name__ == "__main__":
    main()
