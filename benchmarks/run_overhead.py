"""What `loaderdoctor run` costs a training script: the same script run bare (`python train.py`) and under
`loaderdoctor run train.py`, side by side.

Usage: python benchmarks/run_overhead.py [PAIRS]

The script (written to a temporary folder) trains for a fixed number of batches: a loader with 2 persistent
workers whose samples cost a little arithmetic, a step of a small matrix product and a 2 ms sleep (a fast
accelerator step), 6 epochs. It times its own training loop and prints it. Each pair runs the bare script and
the watched one in turns, the order alternating so that a drift favours neither. The table gives each pair's
training-loop seconds and their ratio (watched / bare), and the whole processes' (start-up, imports and
loaderdoctor's summary included); the goal is a loop ratio of 1.02 or less (the median of the pairs). Last, the
rate `loaderdoctor run` reports (its --json) against the script's own rate after its first epoch (the start-up,
which the report states apart): the two should agree within noise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import harness

SCRIPT = """\
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Samples(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        value = float(index)
        for _ in range(200):
            value = (value * 1.000001) % 1e6
        return torch.full((64,), value)

def main():
    loader = DataLoader(Samples(), batch_size=16, num_workers=2, persistent_workers=True)
    weight = torch.randn(64, 64)
    started = time.perf_counter()
    for epoch in range(6):
        for batch in loader:
            (batch @ weight).sum()
            time.sleep(0.002)
        if epoch == 0:
            first_epoch_end = time.perf_counter()  # the start-up, paid once, is in epoch 0
    ended = time.perf_counter()
    print(f"{ended - started:.4f} {5 * len(loader) / (ended - first_epoch_end):.3f}")

if __name__ == "__main__":
    main()
"""


def _timed(command: list[str], cwd: Path) -> tuple[float, float, float]:
    """The script's own training-loop seconds, its own rate after epoch 0 (batches/s), and the whole process's
    seconds."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    whole = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr}")
    loop_s, rate = result.stdout.strip().splitlines()[-1].split()
    return float(loop_s), float(rate), whole


def _reported_rate(path: Path) -> float:
    """The rate `loaderdoctor run --json` reports for the script's one loader."""
    (loader,) = json.loads(path.read_text())["loaders"].values()
    return float(loader["measurements"]["batches_per_s"])


COLUMNS = [
    harness.Column("pair", 4),
    harness.Column("bare loop s", 11, ".3f"),
    harness.Column("run loop s", 10, ".3f"),
    harness.Column("ratio", 6, ".3f", key="loop_ratio"),
    harness.Column("bare proc s", 11, ".2f"),
    harness.Column("run proc s", 10, ".2f"),
    harness.Column("ratio", 6, ".3f", key="process_ratio"),
    harness.Column("own b/s", 8, ".1f"),
    harness.Column("reported", 8, ".1f"),
    harness.Column("ratio", 6, ".3f", key="rate_ratio"),
]


def main(argv: list[str]) -> int:
    args = harness.parser(__doc__, rounds=8, rounds_as="PAIRS").parse_args(argv)
    table = harness.Table(COLUMNS, sep="  ", rule=False)
    with (
        harness.Results(__file__, args) as results,
        harness.script_folder("loaderdoctor-run-overhead-", "train.py", textwrap.dedent(SCRIPT)) as script,
    ):
        cwd = script.parent
        bare = [sys.executable, "train.py"]
        watched = [sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--json", "run.json", "train.py"]
        print(f"{args.rounds} pairs: `python train.py` against `loaderdoctor run train.py` (6 epochs, 1536 batches)")
        table.header()
        commands = {
            "bare": lambda: _timed(bare, cwd),
            "run": lambda: (*_timed(watched, cwd), _reported_rate(cwd / "run.json")),
        }
        for pair, timed in enumerate(harness.in_turns(commands, args.rounds), start=1):
            (bare_loop, _, bare_whole), (run_loop, own_rate, run_whole, reported) = timed["bare"], timed["run"]
            loop, whole, rate = run_loop / bare_loop, run_whole / bare_whole, reported / own_rate
            results.add(
                **table.row(pair, bare_loop, run_loop, loop, bare_whole, run_whole, whole, own_rate, reported, rate)
            )
        loop, whole, rate = (
            harness.median(r[key] for r in results.rows) for key in ("loop_ratio", "process_ratio", "rate_ratio")
        )
        print(f"median ratio, training loop: {loop:.3f} (goal 1.02 or less); whole process: {whole:.3f}")
        print(f"the rate run reports over the script's own (epochs 1-5): median {rate:.3f}")
        results.figures.update(
            {"training loop: run/bare": loop, "whole process: run/bare": whole, "reported/own rate": rate}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
