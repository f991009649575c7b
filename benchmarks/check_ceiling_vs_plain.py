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

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def calibrated(step_ms: float) -> int:
    torch.set_num_threads(1)
    x = torch.ones(64, 256)
    started, n = time.perf_counter(), 0
    while time.perf_counter() - started < 0.3:
        x = torch.tanh(x @ WEIGHT)
        n += 1
    return max(1, round(n * step_ms / 300))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=40.0)
    parser.add_argument("modes", nargs="*", default=["sleep", "cpu"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="check-ceiling-bench-") as folder:
        (Path(folder) / "bench_target.py").write_text(TARGET)
        (Path(folder) / "plain.py").write_text(PLAIN)
        sys.path.insert(0, folder)
        import bench_target  # written just above

        env = {**os.environ, "LOADERDOCTOR_HOME": str(Path(folder) / "home")}
        env["CHECK_BENCH_PASSES"] = str(bench_target.calibrated(20.0))
        print("| mode | round | tool's ceiling b/s | plain's | tool / plain | fix's share, tool | plain's | points |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for mode in args.modes:
            env["CHECK_BENCH_MODE"] = mode
            for number in range(args.rounds):
                command = [sys.executable, "-m", "loaderdoctor", "check", f"{folder}/bench_target.py:loaders",
                           "--json", "--no-history", "--budget", str(args.budget)]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=folder)
                report = json.loads(done.stdout)
                (loader,) = report["loaders"].values()
                v = loader["verification"]
                if v is None or v.get("ceiling_batches_per_s") is None:
                    print(f"| {mode} | {number + 1} | no ceiling measured: {v and v['note']} | | | | | |")
                    continue
                started = time.perf_counter()
                plain_run = subprocess.run(
                    [sys.executable, f"{folder}/plain.py", folder, json.dumps(v["settings"])],
                    capture_output=True, text=True, env=env, cwd=folder, check=True,
                )  # fmt: skip
                plain = json.loads(plain_run.stdout.strip().splitlines()[-1])
                ceiling, plain_ceiling = v["ceiling_batches_per_s"], plain["cached"]
                share, plain_share = v["share_of_ceiling"], plain["real"] / plain["cached"]
                print(
                    f"| {mode} | {number + 1} | {ceiling:.1f} | {plain_ceiling:.1f} | "
                    f"{ceiling / plain_ceiling:.2f} | {share:.0%} | {plain_share:.0%} | "
                    f"{(share - plain_share) * 100:+.1f} |  ({time.perf_counter() - started:.0f} s plain)"
                )
    print("\nshares: the fix's rate over the ceiling; points: tool - plain", file=sys.stderr)


if __name__ == "__main__":
    main()
