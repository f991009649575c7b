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
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import DataLoader

import harness
from harness.shared_datasets import LazyOpen

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
OPEN_ENV = "LOADERDOCTOR_BENCH_OPEN_S"  # how the check's and the plain loops' processes get --open-s
BATCH_SIZE = 8
BATCHES = 24
STEP_S = 0.010
CHECK_TIMEOUT_S = 600
PLAIN_TIMEOUT_S = 300
GOAL = 0.25  # check's speedup within this of the plain loop's


def loader() -> DataLoader:
    """The loader check is pointed at: 2 workers started every epoch."""
    dataset = LazyOpen(float(os.environ.get(OPEN_ENV, "1.0")), BATCHES * BATCH_SIZE)
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
    options = ["--step-ms", str(STEP_S * 1000), "--no-history", "--budget", str(budget_s)]
    env = {**os.environ, OPEN_ENV: str(open_s)}
    report = harness.check_json("benchmarks/lazy_open.py:loader", options, CHECK_TIMEOUT_S, cwd=ROOT, env=env)
    (loader_report,) = report["loaders"].values()
    return loader_report


def plain_rate(settings: dict, open_s: float, epochs: int) -> float | None:
    """Batches per second of a plain loop with `settings` over `epochs` whole epochs after one to warm up."""
    command = [sys.executable, str(HERE), "--plain", json.dumps(settings), str(epochs)]
    return harness.figure_in_fresh_process(command, PLAIN_TIMEOUT_S, env={**os.environ, OPEN_ENV: str(open_s)})


def _plain_in_process(settings_dict: dict, epochs: int) -> float:
    from loaderdoctor.loader.settings import LoaderSpec, Settings

    plain = LoaderSpec.from_loader(loader()).build(Settings.from_dict(settings_dict))
    # the run's one start-up (reported apart by check) in the epoch to warm up
    return harness.loop_rate(plain, lambda _: time.sleep(STEP_S), epochs=epochs, warm_up=1)


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
    contenders = {
        "before": lambda: plain_rate(original, open_s, epochs),
        "after": lambda: plain_rate(fix, open_s, epochs),
    }
    measured = list(harness.in_turns(contenders, pairs))  # original first, then fix first
    row.plain_before = harness.median(r["before"] or None for r in measured)
    row.plain_after = harness.median(r["after"] or None for r in measured)
    row.plain_speedup = harness.median_ratio(measured, "after", "before")
    return row


TABLE = harness.Table(
    [
        harness.Column("round", 6, align="<"),
        harness.Column("fix", 40, align="<"),
        harness.Column("source", 6, align="<"),
        harness.Column("check b/s", 15),
        harness.Column("check", 7, ".2f", "x", key="check_speedup"),
        harness.Column("epoch now/fix", 15),
        harness.Column("agrees", 6),
        harness.Column("plain b/s", 15),
        harness.Column("plain", 7, ".2f", "x", key="plain_speedup"),
        harness.Column("check/", 7, ".2f", key="ratio"),
    ]
)


def print_row(label: str, row: Row) -> None:
    rates = f"{harness.shown(row.check_before, '.1f')} -> {harness.shown(row.check_after, '.1f')}"
    plain = f"{harness.shown(row.plain_before, '.1f')} -> {harness.shown(row.plain_after, '.1f')}"
    epoch = f"{_ms(row.epoch_s)}/{_ms(row.fixed_epoch_s)}"
    agrees = {None: "-", True: "yes", False: "NO"}[row.epoch_line_agrees()]
    TABLE.row(label, row.fix[:40], row.source, rates, row.check_speedup, epoch, agrees, plain,
                     row.plain_speedup, row.ratio)  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


def main(argv: list[str]) -> int:
    parser = harness.parser(__doc__, rounds=1)  # checks, each with its plain loops
    parser.add_argument("--open-s", type=float, default=1.0, help="each worker's open, in seconds (default 1)")
    parser.add_argument("--budget", type=float, default=60.0, help="check's --budget (default 60: it searches)")
    parser.add_argument("--plain-pairs", type=int, default=3, help="pairs of plain loops per check (default 3)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs a plain loop times (default 4)")
    parser.add_argument("--plain", nargs=2, metavar=("SETTINGS", "EPOCHS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain:  # one plain loop, in the fresh process plain_rate starts
        print(json.dumps(_plain_in_process(json.loads(args.plain[0]), int(args.plain[1]))))
        return 0
    results = harness.Results(__file__, args)
    print(
        f"lazy open {args.open_s:g} s per worker start, 2 non-persistent workers, {BATCHES} batches an epoch, "
        f"{STEP_S * 1000:g} ms step; check --budget {args.budget:g}; {args.plain_pairs} pairs of plain loops of "
        f"{args.epochs} epochs each; rates in batches/s over epochs, each epoch's start-up included"
    )
    TABLE.header()
    rows = []
    for number in range(1, args.rounds + 1):
        rows.append(measure(args.open_s, args.budget, args.plain_pairs, args.epochs))
        print_row(str(number), rows[-1])
        results.add(round=number, **dataclasses.asdict(rows[-1]), ratio=rows[-1].ratio)
    ratios = [r.ratio for r in rows if r.ratio is not None]
    within = sum(abs(r - 1) <= GOAL for r in ratios)
    agree = sum(bool(r.epoch_line_agrees()) for r in rows)
    print(
        f"\ncheck's speedup within {GOAL:.0%} of the plain loop's in {within} of {len(ratios)} rounds with both; "
        f"the epoch line equals {BATCHES} batches over the rates in {agree} of {len(rows)}"
    )
    results.figures["check/plain speedup, median"] = harness.median(ratios)
    results.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
