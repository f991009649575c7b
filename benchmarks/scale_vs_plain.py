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

import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

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
    if argv[:1] == ["--rank"]:
        plain_rank(argv[1], float(argv[2]))
        return
    target = argv[0] if argv else "scenario:lock-contention"
    ranks = int(argv[1]) if len(argv) > 1 else 2
    rounds = int(argv[2]) if len(argv) > 2 else 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"{target}, {ranks} ranks: aggregate samples/s, scale vs a plain DDP loop (torchrun)")
    print(f"{'round':>5}  {'scale':>9}  {'plain':>9}  {'ratio':>6}")
    for number in range(rounds):
        order = [_tool, _plain] if number % 2 == 0 else [_plain, _tool]
        figures = {fn.__name__: fn(target, ranks) for fn in order}
        tool, plain = figures["_tool"], figures["_plain"]
        print(f"{number + 1:>5}  {tool:>9.1f}  {plain:>9.1f}  {tool / plain:>6.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
