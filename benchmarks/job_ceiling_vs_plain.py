"""The job's ceiling across ranks (`job-ceiling`: `run --nproc-per-node 2 --ceiling`, and each rank's
`watch(loader, ceiling=True)` under torchrun) against a plain two-rank loop: the ranks meet in an all_reduce at every
step, so the job runs at its slowest rank's pace, with its input and without.

Usage: python benchmarks/job_ceiling_vs_plain.py [--rounds N] [--by run|watch ...] [MODE ...]

Modes: `straggler` (rank 1 reads each sample from slow storage, 4 ms against rank 0's 0.5 ms: the job waits for
rank 1's loader) and `compute-bound` (both ranks' loaders fast: the input costs the job little). The step is a
20 ms sleep standing for an accelerator's, then an all_reduce of a small gradient; gloo, one worker a rank.
For each mode, `rounds` times:
  - the tool, by `run` (`loaderdoctor run --nproc-per-node 2 --ceiling --json F script.py`) and by `watch` (the
    script's loop through `watch(loader, ceiling=True)`, closed after its process group is destroyed): the
    `job-ceiling` finding's ceiling (the job's batches/s with the input taken away), its real rate and the input's
    cost;
  - the plain job, launched by torch's elastic launcher: both ranks in turns of 3 s (harness/ranks.py: real,
    cached, real, cached, real, the cached turns training on the last batch the rank's loader delivered, both ranks
    switching at the same step); the job's rates are rank 0's steps over its time.
The table gives each round's ceilings and their ratio tool / plain, and the input's cost from each (points
apart). It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import harness
from harness.ranks import BENCHMARKS

MODES = {"straggler": (0.0005, 0.004), "compute-bound": (0.0005, 0.0005)}  # each rank's read per sample, seconds

SCRIPT = """\
import sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

READ_S = [float(sys.argv[1]), float(sys.argv[2])]
MODE = sys.argv[3]


class Shards(Dataset):
    def __init__(self, read_s):
        self.read_s = read_s

    def __len__(self):
        return 6400  # 400 batches a rank: more than the turns of either side

    def __getitem__(self, index):
        time.sleep(self.read_s)  # storage: the worker waits, the core is free
        return torch.ones(8)


dist.init_process_group("gloo")
rank = dist.get_rank()
dataset = Shards(READ_S[rank])
loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=False), num_workers=1,
                    persistent_workers=True)
grad = torch.zeros(1000)


def step(batch):
    time.sleep(0.020)  # the accelerator's step
    dist.all_reduce(grad)  # the ranks meet at every step


watched = None
if MODE == "train":
    for batch in loader:
        step(batch)
elif MODE == "watch":
    import loaderdoctor

    watched = loaderdoctor.watch(loader, "bench", ceiling=True, history=False)
    for batch in watched:
        step(batch)
else:  # turns (harness/ranks.py)
    from harness.ranks import turns

    real, cached = turns(loader, step)
    if rank == 0:
        print("TURNS", real, cached, flush=True)
dist.destroy_process_group()
if watched is not None:
    import json

    report = watched.close()
    if rank == 0:
        (job,) = [f.evidence for f in report.findings if f.rule == "job-ceiling"]
        print("JOB", json.dumps(job), flush=True)
"""


def _tool(script: Path, mode: str, work: Path, by: str) -> dict:
    """The job-ceiling finding's evidence, by `run` or by each rank's `watch`."""
    if by == "watch":
        line = next(line for line in _launched(script, mode, "watch") if line.startswith("JOB "))
        return json.loads(line[4:])
    env = {**os.environ, "LOADERDOCTOR_HOME": str(work / "home")}
    reads = [str(r) for r in MODES[mode]]
    arguments = ["--nproc-per-node", "2", "--ceiling", str(script), *reads, "train"]
    loaders = harness.run_json(arguments, work / f"{mode}.json", 600, env=env)["loaders"].values()
    (job,) = [f for loader in loaders for f in loader["findings"] if f["rule"] == "job-ceiling"]
    return job["evidence"]


def _plain(script: Path, mode: str) -> tuple[float, float]:
    line = next(line for line in _launched(script, mode, "turns") if line.startswith("TURNS"))
    real, cached = (float(v) for v in line.split()[1:])
    return real, cached


def _launched(script: Path, mode: str, how: str) -> list[str]:
    """The lines the script printed, launched on two ranks by torch's elastic launcher (`how`: turns or watch)."""
    reads = [str(r) for r in MODES[mode]]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
               *reads, how]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [BENCHMARKS, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True, env=env)
    return result.stdout.splitlines()


COLUMNS = [
    harness.Column("mode", 14, align="<"),
    harness.Column("by", 6, align="<"),
    harness.Column("round", 5),
    *harness.CEILING_COLUMNS,
]


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__doc__, rounds=3)
    parser.add_argument("--by", action="append", choices=["run", "watch"], help="the tool's way (default: both)")
    parser.add_argument("modes", nargs="*", default=list(MODES))
    args = parser.parse_args(argv)
    table = harness.Table(COLUMNS, rule=False)
    with (
        harness.Results(__file__, args) as results,
        harness.script_folder("job-ceiling-bench-", "ranks.py", SCRIPT) as script,
    ):
        work = script.parent
        table.header()
        for mode in args.modes:
            for round_, by in ((r, by) for r in range(1, args.rounds + 1) for by in args.by or ["run", "watch"]):
                started = time.perf_counter()
                tool = _tool(script, mode, work, by)
                real, cached = _plain(script, mode)
                note = (f"   ({time.perf_counter() - started:.0f} s; tool real {tool['real_batches_per_s']:.1f}, plain "
                        f"real {real:.1f} b/s; each rank's cost {tool['input_cost_by_rank']})")  # fmt: skip
                against = harness.ceiling_against_plain(tool["ceiling_batches_per_s"], tool["measured_input_cost"],
                                                        real, cached)  # fmt: skip
                row = table.row(mode, by, round_, *against, note=note)
                results.add(**row, tool_real=tool["real_batches_per_s"], plain_real=real)
            for by in args.by or ["run", "watch"]:
                mine = [r for r in results.rows if r["mode"] == mode and r["by"] == by]
                results.figures[f"{mode}, by {by}: ceiling tool/plain"] = harness.median(r["ratio"] for r in mine)
                results.figures[f"{mode}, by {by}: cost points apart"] = harness.median(r["points"] for r in mine)


if __name__ == "__main__":
    main()
