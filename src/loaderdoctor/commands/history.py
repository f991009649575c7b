"""`loaderdoctor history`: list the runs the history keeps, show one (`history show ID`), or compare two
(`history compare A B`, or the newest run of a name against the runs before it), failing a CI job when slower."""

from __future__ import annotations

import argparse
import json
import math

from rich.console import Console

from loaderdoctor.commands.arguments import add_json_arg, count
from loaderdoctor.errors import UsageError
from loaderdoctor.history.compare import NAMED_SCHEMA, RunComparison, compare_runs, earlier_runs, judge, median_run
from loaderdoctor.history.degradation import BASELINE_RUNS
from loaderdoctor.history.records import RunRecord
from loaderdoctor.history.store import history_path, load_run, load_runs
from loaderdoctor.render import compare as compare_render
from loaderdoctor.render import history as history_render

NAME = "history"
SCHEMA = "loaderdoctor.history/1"
DEFAULT_LIMIT = 20


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        NAME,
        help="list the runs of watch, check, tune and scale kept in the history; `history show ID` shows one, "
        "`history compare A B` two side by side",
        description=(
            "List the runs kept in the history, newest first; show one (`loaderdoctor history show ID`); or compare "
            "two (`loaderdoctor history compare A B`: what changed from A to B, likeliest cause first; "
            "`history compare --name N`: the newest run of N against the runs before it); with --fail-if-slower "
            "PCT, compare exits 1 when the newer run is slower by more than PCT percent and the runs' spread."
        ),
    )
    parser.add_argument("action", nargs="?", metavar="show|compare", help="show one run, or compare two")
    parser.add_argument("run_ids", nargs="*", metavar="ID", help="the run ids (or 'latest') to show or compare")
    parser.add_argument(
        "--name",
        default=None,
        metavar="N",
        help="only the runs of this name; with `compare` and no ids, the newest run of N (and of each N/LOADER: "
        "every loader of `check N`, every rank) against the runs of its name before it",
    )
    parser.add_argument(
        "--baseline",
        type=count("runs", minimum=1),
        default=None,
        metavar="K",
        help=f"with `compare --name N`: set the newest run beside the median of the K runs before it (default "
        f"{BASELINE_RUNS}); their range of rates is the runs' spread the gate allows",
    )
    parser.add_argument(
        "--fail-if-slower",
        type=_percent,
        default=None,
        metavar="PCT",
        help="with `compare`: exit 1 when the newer run's rate is below the other's by more than PCT percent and "
        "by more than the runs' own spread (a CI gate); 0 otherwise",
    )
    parser.add_argument(
        "--limit",
        type=count("runs", minimum=1),
        default=DEFAULT_LIMIT,
        metavar="K",
        help=f"list at most K runs, the newest (default {DEFAULT_LIMIT})",
    )
    add_json_arg(parser, SCHEMA)


def _percent(text: str) -> float:
    """An argparse type: a percent strictly between 0 and 100 ("10" for 10%)."""
    try:
        value = float(text.removesuffix("%"))
    except ValueError:
        value = math.nan
    if not 0 < value < 100:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a percent between 0 and 100 (10 for 10%), not {text!r}")
    return value


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.action == "compare":
        return _compare(args, out)
    for option, value in (("--fail-if-slower", args.fail_if_slower), ("--baseline", args.baseline)):
        if value is not None:
            raise UsageError(f"{option} is for `history compare`", hint="see `loaderdoctor history --help`")
    if args.action is None:
        runs = load_runs(name=args.name, limit=args.limit)
    elif args.action == "show":
        if len(args.run_ids) > 1:
            raise UsageError("history show takes one run id", hint="`loaderdoctor history compare A B` compares two")
        runs = [find_run(args.run_ids[0] if args.run_ids else None)]
    else:
        raise UsageError(
            f"unknown history action {args.action!r}",
            hint="`loaderdoctor history` lists the runs, `history show ID` shows one, `history compare A B` two",
        )
    if args.json:
        document = {"schema": SCHEMA, "runs": [record.to_dict() for record in runs]}
        print(json.dumps(document, indent=2, allow_nan=False))
    elif args.action == "show":
        history_render.render_run(runs[0].to_dict(), out)
    else:
        history_render.render_runs([record.to_dict() for record in runs], str(history_path()), args.name, out)
    return 0


def _compare(args: argparse.Namespace, out: Console) -> int:
    """`history compare A B`: B against A, what changed first; or `--name N`: the newest run of each loader of N
    against the runs before it. With --fail-if-slower, the gate's verdict last, and its exit status."""
    if args.name is not None and not args.run_ids:
        return _compare_named(args, out)
    if args.name is not None or args.baseline is not None:
        raise UsageError(
            "history compare takes two run ids, or --name N (with --baseline K) without ids",
            hint="`history compare A B` compares two runs; `history compare --name N` the newest run of N with the "
            "runs before it",
        )
    if len(args.run_ids) != 2:
        raise UsageError(
            f"history compare takes two run ids, not {len(args.run_ids)}",
            hint="`loaderdoctor history compare A B` shows what changed from run A to run B; `loaderdoctor history` "
            "lists the runs with their ids; `history compare --name N` compares the newest run of N with those "
            "before it",
        )
    comparison = compare_runs(find_run(args.run_ids[0]), find_run(args.run_ids[1]))
    if args.fail_if_slower is not None:
        judge(comparison, args.fail_if_slower / 100)
    status = 1 if comparison.gate is not None and comparison.gate.failed else 0
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2, allow_nan=False, default=str))
    else:
        compare_render.render(comparison, out)
        if comparison.gate is not None:
            out.print()
            compare_render.render_gates([comparison], out)
    return status


def _compare_named(args: argparse.Namespace, out: Console) -> int:
    """The newest run of N (and of each N/LOADER) against the median of the runs of its name before it."""
    name = args.name
    by_name: dict[str, list[RunRecord]] = {}
    for record in load_runs():  # newest first
        if record.name == name or record.name.startswith(f"{name}/"):
            by_name.setdefault(record.name, []).append(record)
    if not by_name:
        raise UsageError(
            f"no run named {name!r} (nor {name}/...) in the history at {history_path()}",
            hint="`loaderdoctor history` lists the runs with their names",
        )
    comparisons: list[RunComparison] = []
    alone: list[str] = []
    for loader in sorted(by_name):
        newest, *before = by_name[loader]
        baseline = earlier_runs(newest, before, args.baseline or BASELINE_RUNS)
        if not baseline:
            alone.append(loader)
            continue
        comparison = compare_runs(median_run(baseline), newest, baseline)
        if args.fail_if_slower is not None:
            judge(comparison, args.fail_if_slower / 100)
        comparisons.append(comparison)
    failed = [c.b.name for c in comparisons if c.gate is not None and c.gate.failed]
    status = 1 if failed else 0
    if args.json:
        document = {
            "schema": NAMED_SCHEMA,
            "name": name,
            "comparisons": [comparison.to_dict() for comparison in comparisons],
            "alone": alone,  # the names with no earlier run to compare with
            "failed": failed,
            "exit_status": status,
        }
        print(json.dumps(document, indent=2, allow_nan=False, default=str))
        return status
    for number, comparison in enumerate(comparisons):
        if number:
            out.rule(style="dim")
        compare_render.render(comparison, out)
    if comparisons:
        out.print()
    if args.fail_if_slower is not None:
        return compare_render.render_gates(comparisons, out, alone)
    compare_render.render_alone(alone, out)
    return status


def find_run(text: str | None) -> RunRecord:
    """The run that `history show TEXT` (or `report TEXT`) names: an id, or 'latest'."""
    where = history_path()
    if text is None:
        raise UsageError("history show needs a run id", hint="`loaderdoctor history` lists the runs with their ids")
    if text == "latest":
        runs = load_runs(limit=1)
        if not runs:
            raise UsageError(f"the history at {where} has no runs yet", hint=history_render.WHERE_RUNS_COME_FROM)
        return runs[0]
    try:
        run_id = int(text)
    except ValueError:
        raise UsageError(
            f"history show takes a run id (a whole number) or 'latest', not {text!r}",
            hint="`loaderdoctor history` lists the runs with their ids",
        ) from None
    found = load_run(run_id) if 0 <= run_id < 2**63 else None  # the history's ids are 64-bit integers
    if found is None:
        raise UsageError(
            f"no run {run_id} in the history at {where}", hint="`loaderdoctor history` lists the runs with their ids"
        )
    return found
