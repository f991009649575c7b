"""Two runs of the benchmarks side by side: each figure a benchmark kept (its ratios, mostly) in both runs, and the
change, under each machine's facts.

Usage: python benchmarks/harness/compare.py OLD NEW

OLD and NEW are folders `make bench` wrote (bench-results/<UTC time>/, one JSON per benchmark) or two JSON files
of one benchmark (its `--json PATH`). A benchmark or figure in one run only is shown with "-" for the other."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MACHINE = ("cpu_model", "cpu_count", "usable_cores", "load_avg_1m", "load_avg_at_end", "torch_version")


def load(path: Path) -> dict[str, dict[str, Any]]:
    """The results in `path` (a folder of them, or one file), by benchmark."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    results = [json.loads(file.read_text()) for file in files]
    return {result["benchmark"]: result for result in results}


def lines(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    """The comparison, line by line: per benchmark, the two runs' machines, then each figure old, new and new/old."""
    out: list[str] = []
    for name in sorted(old.keys() | new.keys()):
        before, after = old.get(name, {}), new.get(name, {})
        out.append(f"== {name} (rounds {before.get('rounds', '-')} / {after.get('rounds', '-')})")
        for side, result in (("old", before), ("new", after)):
            machine = result.get("machine", {})
            facts = ", ".join(f"{key} {machine[key]}" for key in MACHINE if machine.get(key) is not None)
            out.append(f"   {side}: {result.get('started', '-')}; {facts or 'no machine facts'}")
        figures = before.get("figures", {}) | after.get("figures", {})
        for label in figures:
            was, now = before.get("figures", {}).get(label), after.get("figures", {}).get(label)
            change = (
                f"{now / was:.3f}" if isinstance(was, float | int) and isinstance(now, float | int) and was else "-"
            )
            out.append(f"   {label:<60} {_shown(was):>10} {_shown(now):>10} {change:>8}")
    return out


def _shown(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-" if value is None else str(value)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    old, new = (load(Path(arg)) for arg in argv)
    print(f"   {'figure':<60} {'old':>10} {'new':>10} {'new/old':>8}")
    print("\n".join(lines(old, new)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
