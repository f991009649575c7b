"""check's ceiling (the loop's rate with its input taken away, measured beside the fix's verification) against a
plain loop that trains on one cached batch, and the fix's share of it against the plain loops' share.

Usage: python benchmarks/check_ceiling_vs_plain.py [--rounds N] [--budget S] [MODE ...]

Modes: `sleep` (the demo's loader and its 20 ms sleeping step: an accelerator's step leaves the CPU free) and
`cpu` (the demo's loader and a CPU step of matrix passes, their number calibrated once and handed to both sides).
For each mode, in turns, `rounds` times:
  - the tool: `loaderdoctor check bench_target.py:loaders --json`: its verification's ceiling
    (`ceiling_batches_per_s`), the fix's rate and its share of the ceiling;
  - the plain loops, in one process: the loader with the verified fix's settings through the step, and the step on
    one cached batch (the last the loader delivered), in turns of 3 s (real, cached, real, cached, real).
The table gives each round's figures, the ratio tool / plain of the ceiling, and the fix's share of the ceiling
from both, in points. It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import harness

TARGET = """\
import os, time
import torch
import loaderdoctor
from loaderdoctor.scenarios.demo import BlurredImages  # the demo's dataset

WEIGHT = torch.randn(256, 256)


def cpu_step(batch) -> None:
    x = torch.ones(64, 256)
    for _ in range(int(os.environ["CHECK_BENCH_PASSES"])):
        x = torch.tanh(x @ WEIGHT)


def sleep_step(batch) -> None:
    time.sleep(0.020)


def loaders():
    torch.set_num_threads(1)
    train = torch.utils.data.DataLoader(BlurredImages(count=512, size=160, crop=128), batch_size=32)
    return loaderdoctor.Workload(train, step=cpu_step if os.environ["CHECK_BENCH_MODE"] == "cpu" else sleep_step)
"""

PLAIN = """\
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
import bench_target

settings = json.loads(sys.argv[2])
workload = bench_target.loaders()
base = workload.train
loader = torch.utils.data.DataLoader(base.dataset, batch_size=base.batch_size,
                                     num_workers=settings.get("num_workers", 0),
                                     persistent_workers=settings.get("persistent_workers", False))
step = workload.step
TURN_S = 3.0
batches = iter(loader)
last = None

def real(seconds):
    global batches, last
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        try:
            last = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        step(last)
        n += 1
    return n, time.perf_counter() - started

def cached(seconds):
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step(last)
        n += 1
    return n, time.perf_counter() - started

real(1.0)  # start-up and warm-up, outside the turns
turns = {"real": [0, 0.0], "cached": [0, 0.0]}
for kind in ("real", "cached", "real", "cached", "real"):
    n, s = real(TURN_S) if kind == "real" else cached(TURN_S)
    turns[kind][0] += n
    turns[kind][1] += s
print(json.dumps({k: v[0] / v[1] for k, v in turns.items()}))
"""


COLUMNS = [
    harness.Column("mode"),
    harness.Column("round"),
    harness.Column("tool's ceiling b/s", fmt=".1f", key="tool_ceiling"),
    harness.Column("plain's", fmt=".1f", key="plain_ceiling"),
    harness.Column("tool / plain", fmt=".2f", key="ratio"),
    harness.Column("fix's share, tool", fmt=".0%", key="tool_share"),
    harness.Column("plain's", fmt=".0%", key="plain_share"),
    harness.Column("points", fmt="+.1f"),
]


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__doc__, rounds=3)
    parser.add_argument("--budget", type=float, default=40.0)
    parser.add_argument("modes", nargs="*", default=["sleep", "cpu"])
    args = parser.parse_args(argv)
    table = harness.Table(COLUMNS, markdown=True)
    with (
        harness.Results(__file__, args) as results,
        harness.script_folder("check-ceiling-bench-", "bench_target.py", TARGET) as target,
    ):
        folder = str(target.parent)
        (target.parent / "plain.py").write_text(PLAIN)
        env = {**os.environ, "LOADERDOCTOR_HOME": str(Path(folder) / "home")}
        torch.set_num_threads(1)
        env["CHECK_BENCH_PASSES"] = str(harness.calibrated_passes(20.0))
        table.header()
        for mode in args.modes:
            env["CHECK_BENCH_MODE"] = mode
            for number in range(args.rounds):
                report = harness.check_json(f"{folder}/bench_target.py:loaders", ["--no-history", "--budget",
                                            str(args.budget)], None, env=env, cwd=folder)  # fmt: skip
                (loader,) = report["loaders"].values()
                v = loader["verification"]
                if v is None or v.get("ceiling_batches_per_s") is None:
                    table.row(mode, number + 1, f"no ceiling measured: {v and v['note']}", "", "", "", "", "")
                    continue
                started = time.perf_counter()
                plain_run = subprocess.run(
                    [sys.executable, f"{folder}/plain.py", folder, json.dumps(v["settings"])],
                    capture_output=True, text=True, env=env, cwd=folder, check=True,
                )  # fmt: skip
                plain = json.loads(plain_run.stdout.strip().splitlines()[-1])
                ceiling, plain_ceiling = v["ceiling_batches_per_s"], plain["cached"]
                share, plain_share = v["share_of_ceiling"], plain["real"] / plain["cached"]
                took = f"  ({time.perf_counter() - started:.0f} s plain)"
                row = table.row(mode, number + 1, ceiling, plain_ceiling, ceiling / plain_ceiling, share, plain_share,
                                (share - plain_share) * 100, note=took)  # fmt: skip
                results.add(**row)
            mine = [r for r in results.rows if r["mode"] == mode]
            results.figures[f"{mode}: ceiling tool/plain"] = harness.median(r["ratio"] for r in mine)
            results.figures[f"{mode}: share points apart"] = harness.median(r["points"] for r in mine)
    print("\nshares: the fix's rate over the ceiling; points: tool - plain", file=sys.stderr)


if __name__ == "__main__":
    main()
