"""Check every built-in scenario several times and compare what check reports with a plain training loop.

Usage: python benchmarks/scenarios.py [--runs N] [--budget S] [--busy] [NAME ...]

Each run is a fresh `loaderdoctor check scenario:NAME --json` process, so nothing carries over between runs.
Per scenario the table shows how often the main diagnosis was the planted cause, how often the verdict on the
fix was the most common one, the verified fix's speedup (median and range over the runs), and the speedup a
plain training loop measures for the same two settings: a DataLoader built with them, one epoch to warm up,
then whole epochs timed with the scenario's training step after each batch (a fresh process each; the median
of --plain-pairs such pairs, taken in turns).

--busy runs a CPU hog (one busy process, one core) for part of every check (from 20% to 60% of its budget),
as another job on a shared machine would; the plain loops run on a quiet machine, as the reference.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

import harness
from loaderdoctor import scenarios

HERE = Path(__file__).resolve()
PLAIN_MIN_S = 6.0  # a plain loop times whole epochs for at least this long
PLAIN_TIMEOUT_S = 240


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def _hog(after_s: float, for_s: float) -> threading.Thread:
    """A thread that runs a one-core busy process from `after_s` seconds from now, for `for_s` seconds."""

    def run() -> None:
        time.sleep(after_s)
        process = multiprocessing.get_context("spawn").Process(target=_spin, args=(time.monotonic() + for_s,))
        process.start()
        process.join()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def check_once(name: str, budget_s: float, busy: bool) -> tuple[dict, float]:
    hog = _hog(0.2 * budget_s, 0.4 * budget_s) if busy else None
    started = time.monotonic()
    document = harness.check_json(f"scenario:{name}", ["--budget", str(budget_s)], 600)
    wall_s = time.monotonic() - started
    if hog is not None:
        hog.join()
    return document, wall_s


def plain_rate(name: str, settings: dict) -> float | None:
    """Batches per second of a plain loop over the scenario's loader rebuilt with `settings` (a fresh process), or
    None when it hangs (the original settings of fork-deadlock)."""
    command = [sys.executable, str(HERE), "--plain", name, json.dumps(settings)]
    return harness.figure_in_fresh_process(command, PLAIN_TIMEOUT_S)


def plain_speedup(name: str, original: dict, fix: dict, pairs: int) -> float | None:
    """The fix's plain-loop rate over the original's: the median over `pairs` pairs of fresh processes, taken
    in turns (original, fix, original, fix...) so that a quiet spell does not favour one; None when the
    original settings hang."""
    contenders = {"before": lambda: plain_rate(name, original), "after": lambda: plain_rate(name, fix)}
    ratios = []
    for pair in harness.in_turns(contenders, pairs, order="same"):
        if not pair["before"] or not pair["after"]:
            return None
        ratios.append(pair["after"] / pair["before"])
    return statistics.median(ratios)


def _plain_in_process(name: str, settings_dict: dict) -> float:
    """Batches per second of whole epochs for at least PLAIN_MIN_S, after one epoch to warm up (workers started,
    as every long run has them)."""
    from loaderdoctor.loader.settings import LoaderSpec, Settings

    workload = scenarios.get(name).build()
    try:
        step_s = (workload.step_ms or 0.0) / 1000
        loader = LoaderSpec.from_loader(workload.train).build(Settings.from_dict(settings_dict))
        rate = harness.loop_rate(loader, lambda _: time.sleep(step_s), warm_up=1, seconds=PLAIN_MIN_S)
        del loader
        return rate
    finally:
        workload.close()


def main(argv: list[str]) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--busy", action="store_true", help="a one-core hog during part of every check")
    parser.add_argument("--plain-pairs", type=int, default=3, help="pairs of plain loops for the reference")
    parser.add_argument("names", nargs="*")
    parser.add_argument("--plain", nargs=2, metavar=("NAME", "SETTINGS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain:  # one plain loop, in the fresh process plain_rate starts
        print(json.dumps(_plain_in_process(args.plain[0], json.loads(args.plain[1]))))
        return 0
    names = args.names or scenarios.names()
    print(
        f"{args.runs} checks per scenario, --budget {args.budget:g}"
        + (", a one-core hog for part of each" if args.busy else "")
    )
    table = harness.Table(COLUMNS)
    table.header()
    results = harness.Results(__file__, args, rounds=args.runs)
    all_match = True
    for name in names:
        planted = scenarios.get(name).planted_cause
        mains, verdicts, speedups, walls, fixes = [], [], [], [], []
        original = None
        for _ in range(args.runs):
            document, wall_s = check_once(name, args.budget, args.busy)
            (loader,) = document["loaders"].values()
            original = loader["settings"]
            serious = [f["rule"] for f in loader["findings"] if f["severity"] != "info"]
            mains.append(serious[0] if serious else "none")
            verification = loader["verification"]
            verdicts.append(verification["verdict"] if verification else "none")
            if verification and verification["speedup"] is not None and verification["helped"]:
                speedups.append(verification["speedup"])
                fixes.append(json.dumps(verification["settings"], sort_keys=True))
            walls.append(wall_s)
        as_planted = sum(m == (planted or "none") for m in mains)
        verdict, count = collections.Counter(verdicts).most_common(1)[0]
        all_match &= as_planted == args.runs and count == args.runs
        check_speedup = statistics.median(speedups) if speedups else None
        plain = diff = None
        if fixes and original is not None:
            fix = json.loads(collections.Counter(fixes).most_common(1)[0][0])
            plain = plain_speedup(name, original, fix, args.plain_pairs)
            if plain is not None:
                diff = check_speedup / plain - 1 if check_speedup else None
        shown_range = f"{min(speedups):.2f}-{max(speedups):.2f}x" if speedups else "-"
        row = table.row(name, planted or "none", f"{as_planted:>6}/{args.runs:<3}", f"{count:>8}/{args.runs:<3}",
                        verdict, check_speedup, shown_range, plain, diff, statistics.median(walls))  # fmt: skip
        results.add(**row, as_planted_count=as_planted, same_verdict_count=count)
        results.figures[f"{name}: check/plain speedup"] = None if diff is None else diff + 1
    print(f"\nevery run named the planted cause and gave the same verdict: {'yes' if all_match else 'NO'}")
    results.write()
    return 0 if all_match else 1


COLUMNS = [
    harness.Column("scenario", 15, align="<"),
    harness.Column("planted cause", 21, align="<"),
    harness.Column("as planted", 10),
    harness.Column("same verdict", 12),
    harness.Column("verdict", 14, align="<", gap=1),
    harness.Column("check", 7, ".2f", "x"),
    harness.Column("range", 13),
    harness.Column("plain", 7, ".2f", "x"),
    harness.Column("diff", 6, "+.0%"),
    harness.Column("wall s", 7, ".1f"),
]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
