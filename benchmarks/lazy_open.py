"""Whether check's verified speedup for a loader that opens its file lazily is a plain training loop's.

Usage: python benchmarks/lazy_open.py [--open-s S] [--budget S] [--rounds N] [--plain-pairs P] [--epochs E]

The loader (`loader()` below): 24 batches an epoch, 2 workers that do not persist (a new pair every epoch),
fork, a dataset that opens its "file" on first use wherever that is (a sleep of --open-s, then cheap samples:
the h5py pattern, a handle set on the dataset object), and a 10 ms training step. Per round:
1. `loaderdoctor check benchmarks/lazy_open.py:loader --step-ms 10 --json --no-history --budget S` runs in a
   fresh process; from its report come the verified fix (settings, where it came from: the rules or check's
   quick search), its rates before and after, its speedup, and the epoch line's times;
2. a plain training loop (a fresh process each: the loader built with the settings, one epoch to warm up, then
   E whole epochs timed, the step after each batch) measures the original settings and the fix's, P pairs in
   turns (original first, then fix first). The plain speedup is the median of the pairs' ratios.

Read from the table: check's speedup within 25% of the plain loop's (check/plain between 0.75 and 1.25), and the
epoch line's times equal to 24 batches over the rates (the same notion: each epoch's start-up included; the
one start-up of a run is reported apart). The benchmark measures and prints; it asserts nothing and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
OPEN_ENV = "LOADERDOCTOR_BENCH_OPEN_S"  # how the check's and the plain loops' processes get --open-s
BATCH_SIZE = 8
BATCHES = 24
STEP_S = 0.010
CHECK_TIMEOUT_S = 600
PLAIN_TIMEOUT_S = 300
GOAL = 0.25  # check's speedup within this of the plain loop's


class LazyOpen(Dataset):
    """Opens its file on first use, in whatever process that is: each new worker pays the open."""

    def __init__(self, open_s: float) -> None:
        self.open_s = open_s
        self.handle: str | None = None

    def __len__(self) -> int:
        return BATCHES * BATCH_SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.handle is None:
            time.sleep(self.open_s)
            self.handle = "open"
        return torch.full((64,), float(index))


def loader() -> DataLoader:
    """The loader check is pointed at: 2 workers started every epoch."""
    dataset = LazyOpen(float(os.environ.get(OPEN_ENV, "1.0")))
    return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=2, persistent_workers=False,
                      multiprocessing_context="fork")  # fmt: skip


@dataclass
class Row:
    """One round: what check reported and what the plain loops measured (None where nothing was)."""

    fix: str
    source: str
    check_before: float | None
    check_after: float | None
    check_speedup: float | None
    epoch_s: float | None  # the epoch line's time now, and with the fix
    fixed_epoch_s: float | None
    plain_before: float | None = None
    plain_after: float | None = None
    plain_speedup: float | None = None

    @property
    def ratio(self) -> float | None:
        """check's speedup over the plain loop's: 1.0 when check measured what a training loop gets."""
        return None if self.check_speedup is None or not self.plain_speedup else self.check_speedup / self.plain_speedup

    def epoch_line_agrees(self) -> bool | None:
        """Whether the epoch line's times are BATCHES over the verification's rates (within 0.5%: the JSON rounds
        the rates)."""
        pairs = [(self.epoch_s, self.check_before), (self.fixed_epoch_s, self.check_after)]
        if any(s is None or not r for s, r in pairs):
            return None
        return all(abs(s * r / BATCHES - 1) < 0.005 for s, r in pairs)


def check_report(open_s: float, budget_s: float) -> dict:
    """The loader's part of `loaderdoctor check ... --json`, run in a fresh process."""
    command = [sys.executable, "-m", "loaderdoctor", "check", "benchmarks/lazy_open.py:loader", "--step-ms",
               str(STEP_S * 1000), "--json", "--no-history", "--budget", str(budget_s)]  # fmt: skip
    env = {**os.environ, OPEN_ENV: str(open_s)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, cwd=ROOT, env=env)
    if result.returncode not in (0, 1):
        raise SystemExit(f"check failed with status {result.returncode}:\n{result.stderr}")
    (report,) = json.loads(result.stdout)["loaders"].values()
    return report


def plain_rate(settings: dict, open_s: float, epochs: int) -> float | None:
    """Batches per second of a plain loop with `settings` over `epochs` whole epochs after one to warm up."""
    code = (
        "import json, sys\n"
        "from benchmarks.lazy_open import _plain_in_process\n"
        "print(json.dumps(_plain_in_process(json.loads(sys.argv[1]), int(sys.argv[2]))))\n"
    )
    env = {**os.environ, OPEN_ENV: str(open_s)}
    command = [sys.executable, "-c", code, json.dumps(settings), str(epochs)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PLAIN_TIMEOUT_S, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return None
    if result.returncode != 0:
        raise SystemExit(f"the plain loop failed:\n{result.stderr}")
    return json.loads(result.stdout)


def _plain_in_process(settings_dict: dict, epochs: int) -> float:
    from loaderdoctor.loader.settings import LoaderSpec, Settings

    plain = LoaderSpec.from_loader(loader()).build(Settings.from_dict(settings_dict))
    for _ in plain:  # the run's one start-up (reported apart by check)
        time.sleep(STEP_S)
    batches, started = 0, time.perf_counter()
    for _ in range(epochs):
        for _ in plain:
            time.sleep(STEP_S)
            batches += 1
    return batches / (time.perf_counter() - started)


def measure(open_s: float, budget_s: float, pairs: int, epochs: int) -> Row:
    """One check and its plain loops."""
    report = check_report(open_s, budget_s)
    verification = report["verification"] or {}
    epoch = report.get("epoch") or {}
    fix = verification.get("settings")
    original = report["settings"]
    changed = ", ".join(f"{k}={v!r}" for k, v in (fix or {}).items() if v != original.get(k)) or "-"
    row = Row(
        fix=changed,
        source=verification.get("source", "-"),
        check_before=verification.get("before"),
        check_after=verification.get("after"),
        check_speedup=verification.get("speedup"),
        epoch_s=epoch.get("epoch_s"),
        fixed_epoch_s=epoch.get("fixed_epoch_s"),
    )
    if not fix or not verification.get("helped"):
        return row
    befores, afters, ratios = [], [], []
    for pair in range(pairs):
        if pair % 2 == 0:
            before, after = plain_rate(original, open_s, epochs), plain_rate(fix, open_s, epochs)
        else:
            after, before = plain_rate(fix, open_s, epochs), plain_rate(original, open_s, epochs)
        befores += [before] if before else []
        afters += [after] if after else []
        ratios += [after / before] if before and after else []
    row.plain_before = statistics.median(befores) if befores else None
    row.plain_after = statistics.median(afters) if afters else None
    row.plain_speedup = statistics.median(ratios) if ratios else None
    return row


HEADER = (
    f"{'round':<6} {'fix':<40} {'source':<6} {'check b/s':>15} {'check':>7} {'epoch now/fix':>15} "
    f"{'agrees':>6} {'plain b/s':>15} {'plain':>7} {'check/':>7}"
)


def print_row(label: str, row: Row) -> None:
    rates = f"{_num(row.check_before)} -> {_num(row.check_after)}"
    plain = f"{_num(row.plain_before)} -> {_num(row.plain_after)}"
    epoch = f"{_ms(row.epoch_s)}/{_ms(row.fixed_epoch_s)}"
    agrees = {None: "-", True: "yes", False: "NO"}[row.epoch_line_agrees()]
    print(
        f"{label:<6} {row.fix[:40]:<40} {row.source:<6} {rates:>15} {_x(row.check_speedup):>7} {epoch:>15} "
        f"{agrees:>6} {plain:>15} {_x(row.plain_speedup):>7} {_num(row.ratio, 2):>7}",
        flush=True,
    )


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--open-s", type=float, default=1.0, help="each worker's open, in seconds (default 1)")
    parser.add_argument("--budget", type=float, default=60.0, help="check's --budget (default 60: it searches)")
    parser.add_argument("--rounds", type=int, default=1, help="checks, each with its plain loops (default 1)")
    parser.add_argument("--plain-pairs", type=int, default=3, help="pairs of plain loops per check (default 3)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs a plain loop times (default 4)")
    args = parser.parse_args(argv)
    print(
        f"lazy open {args.open_s:g} s per worker start, 2 non-persistent workers, {BATCHES} batches an epoch, "
        f"{STEP_S * 1000:g} ms step; check --budget {args.budget:g}; {args.plain_pairs} pairs of plain loops of "
        f"{args.epochs} epochs each; rates in batches/s over epochs, each epoch's start-up included"
    )
    print(HEADER)
    print("-" * len(HEADER))
    rows = []
    for number in range(1, args.rounds + 1):
        rows.append(measure(args.open_s, args.budget, args.plain_pairs, args.epochs))
        print_row(str(number), rows[-1])
    ratios = [r.ratio for r in rows if r.ratio is not None]
    within = sum(abs(r - 1) <= GOAL for r in ratios)
    agree = sum(bool(r.epoch_line_agrees()) for r in rows)
    print(
        f"\ncheck's speedup within {GOAL:.0%} of the plain loop's in {within} of {len(ratios)} rounds with both; "
        f"the epoch line equals {BATCHES} batches over the rates in {agree} of {len(rows)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
