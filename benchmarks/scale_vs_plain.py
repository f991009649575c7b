"""scale's aggregate samples per second against a plain DDP training loop over the same loader, side by side.

Usage: python benchmarks/scale_vs_plain.py [TARGET] [RANKS] [ROUNDS]
       (defaults: scenario:lock-contention 2 2)

Each round runs, in alternating order, `loaderdoctor scale TARGET --ranks RANKS` and a plain loop started with
torchrun (`python -m torch.distributed.run --standalone`): in each rank, the same target's train loader, epoch
after epoch for the same time, the same simulated step (the workload's step_ms) and one all-reduce per step, as
DDP's gradient all-reduce; its rank 0 prints the ranks' samples per second added up. The table gives both
figures per round and their ratio; the tool's figure must match the plain loop's within noise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import harness

MEASURE_S = 8.0


def plain_rank(target: str, seconds: float) -> None:
    """One rank of the plain loop (run by torchrun): a training loop as a user writes it."""
    from loaderdoctor.targets import resolve as targets

    dist.init_process_group("gloo")
    resolved = targets.resolve(target)
    loader = resolved.loaders["train"]
    step_s = (resolved.workload.step_ms or 0.0) / 1000
    vote = torch.zeros(1)
    samples, epoch, started, warm = 0, 0, None, 0
    done = False
    while not done:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        for batch in loader:
            warm += 1
            if started is None and warm > 2 * max(1, loader.num_workers):
                started = time.perf_counter()  # after the workers' start-up, as scale's steady rate
            elif started is not None:
                samples += len(batch[0]) if isinstance(batch, (list, tuple)) else len(batch)
            time.sleep(step_s)
            vote[0] = 1.0 if started is not None and time.perf_counter() - started >= seconds else 0.0
            dist.all_reduce(vote, op=dist.ReduceOp.MAX)
            if vote.item() > 0:
                done = True
                break
        epoch += 1
    rate = torch.tensor([samples / (time.perf_counter() - started)])
    dist.all_reduce(rate)
    if dist.get_rank() == 0:
        print(json.dumps({"samples_per_s": rate.item()}), flush=True)
    dist.destroy_process_group()
    resolved.close()


def _plain(target: str, ranks: int) -> float:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", __file__,
        "--rank", target, str(MEASURE_S),
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
    line = next(line for line in out.splitlines() if line.startswith("{"))
    return float(json.loads(line)["samples_per_s"])


def _tool(target: str, ranks: int) -> float:
    command = [
        sys.executable, "-m", "loaderdoctor", "scale", target, "--ranks", str(ranks), "--budget", str(MEASURE_S),
        "--json",
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=600).stdout
    document = json.loads(out)
    (loader,) = document["loaders"].values()
    run = next(run for run in loader["runs"] if run["ranks"] == ranks)
    return float(run["samples_per_s"])


def main(argv: list[str]) -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("target", metavar="TARGET", nargs="?", default="scenario:lock-contention")
    parser.add_argument("ranks", metavar="RANKS", type=int, nargs="?", default=2)
    parser.add_argument("rounds", metavar="ROUNDS", type=int, nargs="?", default=2)
    parser.add_argument("--rank", nargs=2, metavar=("TARGET", "SECONDS"), help=argparse.SUPPRESS)  # torchrun's ranks
    args = parser.parse_args(argv)
    if args.rank:
        plain_rank(args.rank[0], float(args.rank[1]))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"{args.target}, {args.ranks} ranks: aggregate samples/s, scale vs a plain DDP loop (torchrun)")
    columns = [harness.Column("round", 5), harness.Column("scale", 9, ".1f"), harness.Column("plain", 9, ".1f")]
    table = harness.Table([*columns, harness.Column("ratio", 6, ".2f")], sep="  ", rule=False)
    table.header()
    contenders = {"scale": lambda: _tool(args.target, args.ranks), "plain": lambda: _plain(args.target, args.ranks)}
    with harness.Results(__file__, args) as results:
        for number, figures in enumerate(harness.in_turns(contenders, args.rounds), start=1):
            results.add(**table.row(number, figures["scale"], figures["plain"], figures["scale"] / figures["plain"]))
        results.figures["scale/plain"] = harness.median_ratio(results.rows, "scale", "plain")


if __name__ == "__main__":
    main(sys.argv[1:])
