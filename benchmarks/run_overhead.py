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
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

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


def main(argv: list[str]) -> int:
    pairs = int(argv[0]) if argv else 8
    with tempfile.TemporaryDirectory(prefix="loaderdoctor-run-overhead-") as folder:
        cwd = Path(folder)
        (cwd / "train.py").write_text(textwrap.dedent(SCRIPT))
        bare = [sys.executable, "train.py"]
        watched = [sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--json", "run.json", "train.py"]
        print(f"{pairs} pairs: `python train.py` against `loaderdoctor run train.py` (6 epochs, 1536 batches)")
        print(f"{'pair':>4}  {'bare loop s':>11}  {'run loop s':>10}  {'ratio':>6}  {'bare proc s':>11}  "
              f"{'run proc s':>10}  {'ratio':>6}  {'own b/s':>8}  {'reported':>8}  {'ratio':>6}")  # fmt: skip
        loop_ratios, whole_ratios, rate_ratios = [], [], []
        for pair in range(pairs):
            order = (bare, watched) if pair % 2 == 0 else (watched, bare)
            times = {id(command): _timed(command, cwd) for command in order}
            (bare_loop, _, bare_whole), (run_loop, own_rate, run_whole) = times[id(bare)], times[id(watched)]
            reported = _reported_rate(cwd / "run.json")
            loop_ratios.append(run_loop / bare_loop)
            whole_ratios.append(run_whole / bare_whole)
            rate_ratios.append(reported / own_rate)
            print(f"{pair + 1:>4}  {bare_loop:>11.3f}  {run_loop:>10.3f}  {loop_ratios[-1]:>6.3f}  "
                  f"{bare_whole:>11.2f}  {run_whole:>10.2f}  {whole_ratios[-1]:>6.3f}  {own_rate:>8.1f}  "
                  f"{reported:>8.1f}  {rate_ratios[-1]:>6.3f}")  # fmt: skip
        loop, whole = statistics.median(loop_ratios), statistics.median(whole_ratios)
        print(f"median ratio, training loop: {loop:.3f} (goal 1.02 or less); whole process: {whole:.3f}")
        print(f"the rate run reports over the script's own (epochs 1-5): median {statistics.median(rate_ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
