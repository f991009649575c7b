"""Check every built-in scenario several times and print what was found and how much the verified fix gained.

Usage: python benchmarks/scenarios.py [RUNS] [NAME ...]

Each run is a fresh `loaderdoctor check scenario:NAME --json` process, so nothing carries over between runs.
The table shows, per scenario, the main diagnosis of every run against the planted cause, the verified fix's
speedup (batches per second after / before, both measured in the same run) and the check's wall time.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from loaderdoctor import scenarios


def run_once(name: str) -> tuple[dict, float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "loaderdoctor", "check", f"scenario:{name}", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall_s = time.monotonic() - started
    if result.returncode not in (0, 1):
        raise SystemExit(f"check scenario:{name} failed with status {result.returncode}:\n{result.stderr}")
    return json.loads(result.stdout), wall_s


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 3
    names = argv[1:] or scenarios.names()
    header = f"{'scenario':<15} {'planted':<21} {'main diagnosis per run':<50} {'speedup (median)':>16} {'wall s':>7}"
    print(header)
    print("-" * len(header))
    all_match = True
    for name in names:
        planted = scenarios.get(name).planted_cause
        mains, speedups, walls = [], [], []
        for _ in range(runs):
            document, wall_s = run_once(name)
            (loader,) = document["loaders"].values()
            serious = [f["rule"] for f in loader["findings"] if f["severity"] != "info"]
            mains.append(serious[0] if serious else "none")
            verification = loader["verification"]
            if verification and verification["helped"]:
                # No speedup is defined where the original settings delivered nothing (a hang): count it apart.
                speedups.append(verification["speedup"] if verification["speedup"] is not None else float("inf"))
            walls.append(wall_s)
        match = all(m == (planted or "none") for m in mains)
        all_match &= match
        median = statistics.median(speedups) if speedups else None
        speedup = "-" if median is None else "hang fixed" if median == float("inf") else f"{median:.2f}x"
        print(
            f"{name:<15} {planted or 'none':<21} {' '.join(mains):<50} {speedup:>16} "
            f"{statistics.median(walls):>7.1f}{'' if match else '  MISMATCH'}"
        )
    print(f"\nevery run named the planted cause: {'yes' if all_match else 'NO'}")
    return 0 if all_match else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
