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
import subprocess
import sys
import threading
import time

from loaderdoctor import scenarios

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
    result = subprocess.run(
        [sys.executable, "-m", "loaderdoctor", "check", f"scenario:{name}", "--json", "--budget", str(budget_s)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall_s = time.monotonic() - started
    if hog is not None:
        hog.join()
    if result.returncode not in (0, 1):
        raise SystemExit(f"check scenario:{name} failed with status {result.returncode}:\n{result.stderr}")
    return json.loads(result.stdout), wall_s


def plain_rate(name: str, settings: dict) -> float | None:
    """Batches per second of a plain loop over the scenario's loader rebuilt with `settings` (a fresh process)."""
    code = (
        "import json, sys\n"
        "from benchmarks.scenarios import _plain_in_process\n"
        "if __name__ == '__main__':\n"
        f"    print(json.dumps(_plain_in_process({name!r}, json.loads(sys.argv[1]))))\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", code, json.dumps(settings)],
            capture_output=True,
            text=True,
            timeout=PLAIN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None  # it hangs: the original settings of fork-deadlock
    if result.returncode != 0:
        raise SystemExit(f"the plain loop of {name} failed:\n{result.stderr}")
    return json.loads(result.stdout)


def plain_speedup(name: str, original: dict, fix: dict, pairs: int) -> float | None:
    """The fix's plain-loop rate over the original's: the median over `pairs` pairs of fresh processes, taken
    in turns (original, fix, original, fix...) so that a quiet spell does not favour one; None when the
    original settings hang."""
    ratios = []
    for _ in range(pairs):
        before, after = plain_rate(name, original), plain_rate(name, fix)
        if not before or not after:
            return None
        ratios.append(after / before)
    return statistics.median(ratios)


def _plain_in_process(name: str, settings_dict: dict) -> float:
    from loaderdoctor.loader.settings import LoaderSpec, Settings

    workload = scenarios.get(name).build()
    try:
        step_s = (workload.step_ms or 0.0) / 1000
        loader = LoaderSpec.from_loader(workload.train).build(Settings.from_dict(settings_dict))
        for _ in loader:  # one epoch to warm up: workers started, as every long run has them
            time.sleep(step_s)
        batches, started = 0, time.perf_counter()
        while time.perf_counter() - started < PLAIN_MIN_S:
            for _ in loader:
                time.sleep(step_s)
                batches += 1
        rate = batches / (time.perf_counter() - started)
        del loader
        return rate
    finally:
        workload.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--busy", action="store_true", help="a one-core hog during part of every check")
    parser.add_argument("--plain-pairs", type=int, default=3, help="pairs of plain loops for the reference")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    names = args.names or scenarios.names()
    print(
        f"{args.runs} checks per scenario, --budget {args.budget:g}"
        + (", a one-core hog for part of each" if args.busy else "")
    )
    header = (
        f"{'scenario':<15} {'planted cause':<21} {'as planted':>10} {'same verdict':>12}  {'verdict':<14}"
        f" {'check':>7} {'range':>13} {'plain':>7} {'diff':>6} {'wall s':>7}"
    )
    print(header)
    print("-" * len(header))
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
        print(
            f"{name:<15} {planted or 'none':<21} {as_planted:>6}/{args.runs:<3} {count:>8}/{args.runs:<3}  "
            f"{verdict:<14} {_x(check_speedup):>7} {shown_range:>13} {_x(plain):>7} "
            f"{'-' if diff is None else f'{diff:+.0%}':>6} {statistics.median(walls):>7.1f}"
        )
    print(f"\nevery run named the planted cause and gave the same verdict: {'yes' if all_match else 'NO'}")
    return 0 if all_match else 1


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
