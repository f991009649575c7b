"""What `loaderdoctor run` costs a job of two nodes: the same DDP script run by plain torchrun on two real nodes and
by `loaderdoctor run --nnodes 2` on the same two, side by side.

Usage: python benchmarks/nodes_overhead.py [PAIRS]   (as root: it makes two network namespaces joined by a veth)

The nodes are two network namespaces of this machine with their own hostnames and addresses (198.18.0.1 and .2),
gloo over the veth (harness/twonodes.py). The script: one rank per node, a loader with 2 persistent workers whose
samples cost a little arithmetic, a step of a small matrix product, an all-reduce and a 2 ms sleep, 6 epochs; rank
0 times its own training loop and prints it, with its process's CPU seconds in the loop (what loaderdoctor adds to
the rank: its tap in the training thread, its threads). Each pair runs the plain job and the watched one in turns,
the order alternating. The table gives each pair's training-loop seconds and their ratio (watched / plain), the
CPU's, and the whole job's (the rendezvous, imports and loaderdoctor's gathering and summary included); the goal
is a loop ratio of 1.02 or less (the median of the pairs). On a machine whose speed drifts from one job to the
next (a shared VM: the same plain job here takes 4 to 7 s), the pairs' span says how far one median can be
trusted. Last, the rate rank 0's loader is reported at (node 0's --json) against
the script's own after its first epoch: the two should agree within noise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import harness
from harness.twonodes import skip_reason, two_nodes

SCRIPT = """\
import time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

class Samples(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        value = float(index)
        for _ in range(200):
            value = (value * 1.000001) % 1e6
        return torch.full((64,), value)

def main():
    dist.init_process_group("gloo")
    sampler = DistributedSampler(Samples())
    loader = DataLoader(Samples(), batch_size=16, num_workers=2, persistent_workers=True, sampler=sampler)
    weight = torch.randn(64, 64)
    started, cpu_started = time.perf_counter(), time.process_time()
    for epoch in range(6):
        sampler.set_epoch(epoch)
        for batch in loader:
            total = (batch @ weight).sum()
            dist.all_reduce(total)
            time.sleep(0.002)
        if epoch == 0:
            first_epoch_end = time.perf_counter()
    ended, cpu_ended = time.perf_counter(), time.process_time()
    if dist.get_rank() == 0:
        rate = 5 * len(loader) / (ended - first_epoch_end)
        print(f"{ended - started:.4f} {rate:.3f} {cpu_ended - cpu_started:.4f}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""
PORT = 29560


def _job(nodes: tuple, command: list[str], cwd: Path) -> tuple[float, float, float, float]:
    """Rank 0's training-loop seconds, its rate after epoch 0 and its process's CPU seconds in the loop (every
    thread's: the training thread's and loaderdoctor's), and the whole job's seconds."""
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            node.command([*command, "--node-rank", str(rank), "train.py"]),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, node in enumerate(nodes)
    ]
    outputs = [process.communicate(timeout=600) for process in processes]
    whole = time.perf_counter() - started
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        if process.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{stderr}")
    loop_s, rate, cpu_s = outputs[0][0].strip().splitlines()[-1].split()
    return float(loop_s), float(rate), float(cpu_s), whole


def _reported_rate(path: Path) -> float:
    """The rate node 0's `--json` reports for rank 0's loader."""
    loaders = json.loads(path.read_text())["loaders"]
    (name,) = [name for name in loaders if name.endswith("/rank0")]
    return float(loaders[name]["measurements"]["batches_per_s"])


COLUMNS = [
    harness.Column("pair", 4),
    harness.Column("plain loop s", 12, ".3f"),
    harness.Column("run loop s", 10, ".3f"),
    harness.Column("ratio", 6, ".3f", key="loop_ratio"),
    harness.Column("plain cpu s", 11, ".3f"),
    harness.Column("run cpu s", 9, ".3f"),
    harness.Column("ratio", 6, ".3f", key="cpu_ratio"),
    harness.Column("plain job s", 11, ".2f"),
    harness.Column("run job s", 9, ".2f"),
    harness.Column("ratio", 6, ".3f", key="job_ratio"),
    harness.Column("own b/s", 8, ".1f"),
    harness.Column("reported", 8, ".1f"),
    harness.Column("ratio", 6, ".3f", key="rate_ratio"),
]


def main(argv: list[str]) -> int:
    args = harness.parser(__doc__, rounds=6, rounds_as="PAIRS").parse_args(argv)
    if (why := skip_reason()) is not None:
        raise SystemExit(f"two nodes cannot be made here: {why}")
    table = harness.Table(COLUMNS, sep="  ", rule=False)
    with (
        harness.Results(__file__, args) as results,
        harness.script_folder("loaderdoctor-nodes-overhead-", "train.py", textwrap.dedent(SCRIPT)) as script,
        two_nodes() as nodes,
    ):
        cwd = script.parent
        endpoint = f"{nodes[0].address}:{PORT}"
        common = ["--nnodes", "2", "--nproc-per-node", "1"]
        plain = [sys.executable, "-m", "torch.distributed.run", *common, "--master-addr", nodes[0].address,
                 "--master-port", str(PORT)]  # fmt: skip
        watched = [sys.executable, "-m", "loaderdoctor", "run", *common, "--rdzv-endpoint", endpoint, "--no-history",
                   "--json", os.fspath(cwd / "run.json")]  # fmt: skip
        print(f"{args.rounds} pairs: torchrun against `loaderdoctor run` on 2 nodes x 1 rank (6 epochs)")
        table.header()
        commands = {
            "plain": lambda: _job(nodes, plain, cwd),
            "run": lambda: (*_job(nodes, watched, cwd), _reported_rate(cwd / "run.json")),
        }
        for pair, timed in enumerate(harness.in_turns(commands, args.rounds), start=1):
            (plain_loop, _, plain_cpu, plain_whole) = timed["plain"]
            (run_loop, own_rate, run_cpu, run_whole, reported) = timed["run"]
            loop, cpu, whole = run_loop / plain_loop, run_cpu / plain_cpu, run_whole / plain_whole
            rate = reported / own_rate
            results.add(**table.row(pair, plain_loop, run_loop, loop, plain_cpu, run_cpu, cpu, plain_whole, run_whole,
                                    whole, own_rate, reported, rate))  # fmt: skip
        loop, cpu, whole, rate = (
            harness.median(r[key] for r in results.rows)
            for key in ("loop_ratio", "cpu_ratio", "job_ratio", "rate_ratio")
        )
        spread = sorted(r["loop_ratio"] for r in results.rows)
        print(
            f"median ratio, training loop: {loop:.3f} (goal 1.02 or less; the pairs span {spread[0]:.3f} to "
            f"{spread[-1]:.3f}); rank 0's CPU in its loop: {cpu:.3f}; whole job: {whole:.3f}"
        )
        print(f"the rate run reports over the script's own (epochs 1-5): median {rate:.3f}")
        results.figures.update(
            {
                "training loop: run/plain": loop,
                "rank 0's loop CPU: run/plain": cpu,
                "whole job: run/plain": whole,
                "reported/own rate": rate,
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
