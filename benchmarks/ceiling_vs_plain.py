"""`loaderdoctor run --ceiling` against plain loops (issue 36's done-when): the ceiling the tool measures in a
script's data-free turns, and the input's cost, against what a plain loop feeding one cached batch measures beside
the real loop, in turns.

Usage: python benchmarks/ceiling_vs_plain.py [--rounds N] [MODE ...]

Modes: `starved` (the built-in starved training script, examples/starved_train.py, run by the tool as it is with
--epochs 10: samples decoded in the main process, a 20 ms sleep for the step; the plain loops use its loader and
step), `storage` (the starved scenario's dataset and settings: every sample waits ~8 ms on storage, 2 workers; a
20 ms CPU step) and `compute-bound` (the healthy scenario's, with a 60 ms CPU step); those two with 1,536 samples,
so that an epoch is longer than the turns. For each mode, a training script
(written to a temporary folder) runs its loop for a fixed number of epochs. Then, in turns, `rounds` times:
  - the tool: `loaderdoctor run --ceiling --json F script.py`: its ceiling (batches/s with the input taken away),
    the rate of its real turns and the input's cost (1 - real / ceiling);
  - the plain loops, in one process: the real loop and a loop that trains on one cached batch (the last the loader
    delivered) in turns of 3 s (real, cached, real, cached, real), whose rates give the plain ceiling and cost.
The table gives each round's figures and the ratio tool / plain of the ceiling (goal: within 10%), and the
difference of the input's cost in points (goal: within 10). It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness

# mode: (whose loader, step ms, epochs); "example" is examples/starved_train.py, which the tool runs as it is
MODES = {"starved": ("example", 20, 10), "storage": ("storage", 20, 3), "compute-bound": ("healthy", 60, 4)}
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "starved_train.py"

SCRIPT = """\
import os, sys, time
import torch
from torch.utils.data import DataLoader
from loaderdoctor.scenarios._pipelines import ImageDataset
from loaderdoctor.scenarios.starved import RemoteImages

SCENARIO, STEP_MS, EPOCHS = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
MODE = sys.argv[4] if len(sys.argv) > 4 else "train"
WEIGHT = torch.randn(256, 256)
torch.set_num_threads(1)


def calibrated() -> int:
    x = torch.randn(64, 256)
    started, n = time.perf_counter(), 0
    while time.perf_counter() - started < 0.3:
        x = torch.tanh(x @ WEIGHT)
        n += 1
    return max(1, round(n * STEP_MS / 300))


# Calibrated once by the benchmark and handed to every run (the tool's and the plain one's): the same step cost
PASSES = int(os.environ["CEILING_BENCH_PASSES"]) if "CEILING_BENCH_PASSES" in os.environ else calibrated()
if MODE == "calibrate":
    print("PASSES", PASSES)
    sys.exit(0)


def step(batch) -> None:
    if SCENARIO == "example":
        time.sleep(STEP_MS / 1000)  # the example's step: a sleep standing for an accelerator's
        return
    x = torch.randn(64, 256)
    for _ in range(PASSES):
        x = torch.tanh(x @ WEIGHT)


def train(loader) -> None:
    for _ in range(EPOCHS):
        for batch in loader:
            step(batch)


def turns(loader, turn_s: float = 3.0) -> None:
    # real, cached, real, cached, real: the cached loop trains on the last batch the loader delivered
    stream = iter(loader)
    def real_batch():
        nonlocal stream
        try:
            return next(stream)
        except StopIteration:
            stream = iter(loader)
            return next(stream)
    last = real_batch()
    for _ in range(5):
        step(last)  # warm up
        last = real_batch()
    rates = {"real": [], "cached": []}
    for n in range(5):
        kind = "cached" if n % 2 else "real"
        started, steps = time.perf_counter(), 0
        while time.perf_counter() - started < turn_s:
            batch = last if kind == "cached" else real_batch()
            step(batch)
            steps += 1
            if kind == "real":
                last = batch
        rates[kind].append(steps / (time.perf_counter() - started))
    print("TURNS", rates["real"], rates["cached"], flush=True)


# The scenarios' datasets and settings, with more samples, so that an epoch holds more than the turns' steps
if SCENARIO == "example":  # examples/starved_train.py's loader: decoded in the main process
    sys.path.insert(0, sys.argv[5])
    from starved_train import Decoded
    loader = DataLoader(Decoded(), batch_size=32, shuffle=True)
elif SCENARIO == "storage":
    dataset = RemoteImages(count=1536, size=80, crop=64)
    loader = DataLoader(dataset, batch_size=16, num_workers=2, persistent_workers=True)
else:
    dataset = ImageDataset(count=1536, size=112, crop=96)
    loader = DataLoader(dataset, batch_size=32, num_workers=2, persistent_workers=True)
(turns if MODE == "turns" else train)(loader)
"""


def _tool(script: Path, mode: str, work: Path) -> dict:
    scenario, step_ms, epochs = MODES[mode]
    env = {**os.environ, "LOADERDOCTOR_HOME": str(work / "home")}
    trained = (
        [str(EXAMPLE), "--epochs", str(epochs)]
        if scenario == "example"
        else [str(script), scenario, str(step_ms), str(epochs)]
    )
    document = harness.run_json(["--ceiling", *trained], work / f"{mode}.json", 600, env=env)
    (loader,) = document["loaders"].values()
    return loader["measurements"]["ceiling"]


def _plain(script: Path, mode: str) -> tuple[float, float]:
    """The plain loops' mean rates in their real turns and in their cached ones."""
    scenario, step_ms, epochs = MODES[mode]
    command = [sys.executable, str(script), scenario, str(step_ms), str(epochs), "turns", str(EXAMPLE.parent)]
    return _turn_rates(subprocess.run(command, capture_output=True, text=True, timeout=600, check=True).stdout)


def _turn_rates(stdout: str) -> tuple[float, float]:
    line = next(line for line in stdout.splitlines() if line.startswith("TURNS"))
    real_text, cached_text = line[len("TURNS ") :].split("] [")
    real = [float(v) for v in real_text.strip("[]").split(",")]
    cached = [float(v) for v in cached_text.strip("[]").split(",")]
    return statistics.mean(real), statistics.mean(cached)


COLUMNS = [
    harness.Column("mode", 14, align="<"),
    harness.Column("round", 5),
    *harness.CEILING_COLUMNS,
    harness.Column("waits said", 10, ".0f", "%", gap=2, key="waits_said_pct"),
]


def _calibrate(script: Path, mode: str) -> None:
    """The step's passes for `mode`, calibrated once and handed to every run (the tool's and the plain one's)."""
    scenario, step_ms, epochs = MODES[mode]
    os.environ.pop("CEILING_BENCH_PASSES", None)  # the last mode's: this one calibrates its own step
    calibration = subprocess.run(
        [sys.executable, str(script), scenario, str(step_ms), str(epochs), "calibrate", str(EXAMPLE.parent)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    os.environ["CEILING_BENCH_PASSES"] = calibration.stdout.split()[-1]


def _row(table: harness.Table, mode: str, round_: int, tool: dict, plain: tuple[float, float], took_s: float) -> dict:
    """Prints one round's row; its figures."""
    real, cached = plain
    note = (f"   ({took_s:.0f} s; tool real {tool['real_batches_per_s']:.1f}, plain real {real:.1f} b/s; "
            f"{tool['data_free_steps']} data-free steps)")  # fmt: skip
    against = harness.ceiling_against_plain(tool["ceiling_batches_per_s"], tool["input_cost"], real, cached)
    row = table.row(mode, round_, *against, tool["wait_model_input_cost"] * 100, note=note)
    return {**row, "tool_real": tool["real_batches_per_s"], "plain_real": real}


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__doc__, rounds=3)
    parser.add_argument("modes", nargs="*", default=list(MODES))
    args = parser.parse_args(argv)
    table = harness.Table(COLUMNS, rule=False)
    with (
        harness.Results(__file__, args) as results,
        harness.script_folder("ceiling-bench-", "train.py", SCRIPT) as script,
    ):
        work = script.parent
        table.header()
        for mode in args.modes:
            _calibrate(script, mode)
            sides = {
                "tool": functools.partial(_tool, script, mode, work),
                "plain": functools.partial(_plain, script, mode),
            }
            started = time.perf_counter()
            for round_, measured in enumerate(harness.in_turns(sides, args.rounds, order="same"), start=1):
                results.add(
                    **_row(table, mode, round_, measured["tool"], measured["plain"], time.perf_counter() - started)
                )
                started = time.perf_counter()
            mine = [r for r in results.rows if r["mode"] == mode]
            results.figures[f"{mode}: ceiling tool/plain"] = harness.median(r["ratio"] for r in mine)
            results.figures[f"{mode}: cost points apart"] = harness.median(r["points"] for r in mine)


if __name__ == "__main__":
    main()
