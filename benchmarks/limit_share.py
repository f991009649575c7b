"""How close check's verified fix comes to the limit check states, and whether its speedup is a plain loop's.

Usage: python benchmarks/limit_share.py [--budget S] [--rounds N] [--plain-pairs P] [TARGET ...]

TARGETs are `demo` and the built-in scenarios whose fix is a change of settings (default: all of them). Per
target and round:
1. `loaderdoctor check TARGET --json --no-history --budget S` runs in a fresh process; from its report come the
   limit it states (measurements.limit: batches/s and what binds), the original rate and its share of that
   limit, and the verified fix: its rate, settings, speedup and share_of_limit;
2. a plain training loop (benchmarks/scenarios.py's: a DataLoader built with the settings, one epoch to warm
   up, then whole epochs timed with the scenario's training step, a fresh process each) measures the original
   settings and the fix's side by side, P pairs, the order alternating (original first, then fix first), so
   that a drift on the machine favours neither. The plain fix rate is the median of its P runs, the plain
   speedup the median of the P pairs' ratios; its share is of the limit check stated.

The issue's goal, read from the table: the verified fix reaches 90% or more of the stated limit, and check's
speedup is within 10% of the plain loop's (check/plain between 0.90 and 1.10). The benchmark measures and prints;
it asserts nothing and exits 0. Run it on an otherwise quiet machine.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import harness
from loaderdoctor.loader.settings import Settings
from scenarios import plain_rate

ROOT = Path(__file__).resolve().parents[1]
# tests/integration/test_scenarios.py's FIXED_BY_SETTINGS: the targets whose verified fix is a change of settings
TARGETS = ("demo", "starved", "respawn", "fork-deadlock", "oversubscribed", "slow-start")
CHECK_TIMEOUT_S = 900
GOAL_SHARE = 0.90  # the verified fix reaches this share of the stated limit
GOAL_SPEEDUP_DIFF = 0.10  # check's speedup within this of the plain loop's


@dataclass
class Row:
    """What one check and its plain loops measured for a target; None where nothing could be measured."""

    target: str
    binds: str | None = None
    limit: float | None = None  # batches/s, as check's measurements state it
    original: float | None = None  # check's rate of the original settings
    original_share: float | None = None
    check_fix: float | None = None  # the verified fix's rate in check's windows
    check_share: float | None = None  # as check reports it (verification.share_of_limit)
    plain_fix: float | None = None
    check_speedup: float | None = None
    plain_speedup: float | None = None
    fix: str = "-"  # the fix's settings in words
    notes: list[str] = field(default_factory=list)

    @property
    def plain_share(self) -> float | None:
        """The plain loop's rate of the fix as a share of the limit check stated."""
        return _ratio(self.plain_fix, self.limit)

    @property
    def speedup_ratio(self) -> float | None:
        """check's speedup over the plain loop's: 1.0 when check measured what a training loop gets."""
        return _ratio(self.check_speedup, self.plain_speedup)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def check_report(target: str, budget_s: float) -> dict:
    """The train loader's part of `loaderdoctor check TARGET --json` run in a fresh process."""
    report = harness.check_json(target, ["--no-history", "--budget", str(budget_s)], CHECK_TIMEOUT_S, cwd=ROOT)
    return report["loaders"]["train"]


def measure(name: str, budget_s: float, pairs: int) -> Row:
    """One check of scenario `name` and the plain loops of its original and fixed settings."""
    loader = check_report(name if name == "demo" else f"scenario:{name}", budget_s)
    measured = loader["measurements"]
    limit = measured["limit"]
    row = Row(
        name,
        binds=limit["binds"],
        limit=limit["batches_per_s"],
        original=measured["batches_per_s"],
        original_share=measured["share_of_limit"],
    )
    if row.limit is None:
        row.notes.append(f"no limit stated: {limit['unknown']}")
    verification = loader["verification"]
    if verification is None:
        row.notes.append("check verified no fix: nothing to compare")
        return row
    row.fix = Settings.from_dict(verification["settings"]).describe()
    row.check_fix = verification["after"] if verification["after_outcome"] == "completed" else None
    row.check_share = verification["share_of_limit"]
    row.check_speedup = verification["speedup"]
    stated_share = _ratio(row.check_fix, row.limit)
    if row.check_share is not None and stated_share is not None and abs(row.check_share - stated_share) > 0.02:
        row.notes.append(
            f"check's share_of_limit {row.check_share:.0%} is of {row.check_fix / row.check_share:.1f} batches/s,"
            f" not the stated limit (there the fix is at {stated_share:.0%})"
        )
    if row.check_share is None and stated_share is not None:
        row.notes.append(f"check reports no share for the fix; its rate is {stated_share:.0%} of the stated limit")
    if not verification["helped"] or row.check_fix is None:
        row.notes.append(f"the fix's verdict is {verification['verdict']}: no plain loop run")
        return row
    fix = verification["settings"]
    if row.check_speedup is None:
        # fork-deadlock: the original settings hang (what check found), so they have no rate; the fix alone
        row.notes.append(
            f"the original settings {verification['before_outcome']} (verdict {verification['verdict']}):"
            " no original rate, no speedup; the plain loop runs the fix alone"
        )
        rates = [rate for rate in (plain_rate(name, fix) for _ in range(pairs)) if rate]
        row.plain_fix = statistics.median(rates) if rates else None
        return row
    original = loader["settings"]
    contenders = {"before": lambda: plain_rate(name, original), "after": lambda: plain_rate(name, fix)}
    measured = list(harness.in_turns(contenders, pairs))  # original first, then fix first
    ratios = harness.per_round_ratios(measured, "after", "before")
    row.plain_fix = harness.median(r["after"] or None for r in measured)
    row.plain_speedup = harness.median(ratios)
    if len(ratios) < pairs:
        row.notes.append(f"{pairs - len(ratios)} of {pairs} plain pairs did not finish (a hang: timed out)")
    return row


def median_row(rows: list[Row]) -> Row:
    """The median of each figure over rounds of one target (the most common binds and fix)."""

    def median(name: str) -> float | None:
        values = [getattr(r, name) for r in rows if getattr(r, name) is not None]
        return statistics.median(values) if values else None

    median_of = {
        name: median(name)
        for name in (
            "limit",
            "original",
            "original_share",
            "check_fix",
            "check_share",
            "plain_fix",
            "check_speedup",
            "plain_speedup",
        )
    }
    binds = collections.Counter(r.binds for r in rows).most_common(1)[0][0]
    fix = collections.Counter(r.fix for r in rows).most_common(1)[0][0]
    return Row(rows[0].target, binds=binds, fix=fix, **median_of)


COLUMNS = [
    harness.Column("target", 15, align="<"),
    harness.Column("binds", 11, align="<"),
    harness.Column("limit", 7, ".1f"),
    harness.Column("orig", 7, ".1f"),
    harness.Column("share", 6, ".0%", key="original_share"),
    harness.Column("check", 7, ".1f", key="check_fix"),
    harness.Column("share", 6, ".0%", key="check_share"),
    harness.Column("plain", 7, ".1f", key="plain_fix"),
    harness.Column("share", 6, ".0%", key="plain_share"),
    harness.Column("check", 8, ".2f", "x", key="check_speedup"),
    harness.Column("plain", 8, ".2f", "x", key="plain_speedup"),
    harness.Column("check/", 7, ".2f", key="speedup_ratio"),
]
TABLE = harness.Table(COLUMNS)
UNITS = ["", "", "b/s", "b/s", "", "fix b/s", "", "fix b/s", "", "speedup", "speedup", "plain"]


def print_header(title: str) -> None:
    print(f"\n{title}")
    TABLE.header(UNITS)


def print_row(row: Row) -> None:
    TABLE.row(row.target, row.binds or "-", row.limit, row.original, row.original_share, row.check_fix,
              row.check_share, row.plain_fix, row.plain_share, row.check_speedup, row.plain_speedup,
              row.speedup_ratio)  # fmt: skip


def print_details(by_target: dict[str, list[Row]]) -> None:
    """Each target's fixes in words and the notes on what could not be measured or disagrees, over all rounds."""
    print("\nfixes and notes")
    for name, rows in by_target.items():
        fixes = collections.Counter(row.fix for row in rows)
        print(
            f"  {name:<15} fix: "
            + "; ".join(f"{fix} ({count}x)" if len(rows) > 1 else fix for fix, count in fixes.items())
        )
        for note in dict.fromkeys(note for row in rows for note in row.notes):
            print(f"  {'':<15} {note}")


def print_goals(rows: list[Row]) -> None:
    """Which targets meet the issue's two goals, as the table shows them (no verdict on the run)."""
    share_met = [r.target for r in rows if r.check_share is not None and r.check_share >= GOAL_SHARE]
    plain_met = [r.target for r in rows if r.plain_share is not None and r.plain_share >= GOAL_SHARE]
    close = [r.target for r in rows if r.speedup_ratio is not None and abs(r.speedup_ratio - 1) <= GOAL_SPEEDUP_DIFF]
    measured = [r.target for r in rows if r.speedup_ratio is not None]
    print(
        f"\nfix at {GOAL_SHARE:.0%} or more of the limit, as check reports it (the notes say where that limit is"
        f" another than the stated one): {', '.join(share_met) or 'none'}"
    )
    print(f"fix at {GOAL_SHARE:.0%} or more of the stated limit in the plain loop: {', '.join(plain_met) or 'none'}")
    print(
        f"check's speedup within {GOAL_SPEEDUP_DIFF:.0%} of the plain loop's: {', '.join(close) or 'none'}"
        f" (of {', '.join(measured) or 'none'} with both speedups)"
    )


def main(argv: list[str]) -> int:
    parser = harness.parser(__doc__, rounds=1)  # checks per target, each with its plain loops
    parser.add_argument("--budget", type=float, default=40.0, help="check's --budget in seconds (default 40)")
    parser.add_argument("--plain-pairs", type=int, default=3, help="pairs of plain loops per check (default 3)")
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"some of {', '.join(TARGETS)} (default all)")
    args = parser.parse_args(argv)
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"not a target fixed by settings: {', '.join(sorted(unknown))} (choose from {', '.join(TARGETS)})")
    targets = args.targets or list(TARGETS)
    print(
        f"check --budget {args.budget:g}, {args.plain_pairs} pairs of plain loops per check, {args.rounds} round(s);"
        f" limit and rates in batches/s, shares of the stated limit"
    )
    results = harness.Results(__file__, args)
    by_target: dict[str, list[Row]] = {name: [] for name in targets}
    for round_number in range(1, args.rounds + 1):
        print_header(f"round {round_number} of {args.rounds}")
        for name in targets:
            row = measure(name, args.budget, args.plain_pairs)
            by_target[name].append(row)
            print_row(row)
            results.add(round=round_number, **_figures(row))
    print_details(by_target)
    final = [rows[0] for rows in by_target.values()]
    if args.rounds > 1:
        final = [median_row(rows) for rows in by_target.values()]
        print_header(f"median over {args.rounds} rounds")
        for row in final:
            print_row(row)
    print_goals(final)
    for row in final:
        results.figures[f"{row.target}: check/plain speedup"] = row.speedup_ratio
        results.figures[f"{row.target}: fix's share of the limit, check"] = row.check_share
        results.figures[f"{row.target}: fix's share of the limit, plain"] = row.plain_share
    results.write()
    return 0


def _figures(row: Row) -> dict[str, object]:
    return {**dataclasses.asdict(row), "plain_share": row.plain_share, "speedup_ratio": row.speedup_ratio}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
