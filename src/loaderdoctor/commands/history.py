"""`loaderdoctor history`: list the runs the history keeps, or show one of them in detail (`history show ID`)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from loaderdoctor.commands.arguments import add_json_arg, count
from loaderdoctor.errors import UsageError
from loaderdoctor.history.compare import compare_runs
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
            "two (`loaderdoctor history compare A B`: what changed from A to B, likeliest cause first)."
        ),
    )
    parser.add_argument("action", nargs="?", metavar="show|compare", help="show one run, or compare two")
    parser.add_argument("run_ids", nargs="*", metavar="ID", help="the run ids (or 'latest') to show or compare")
    parser.add_argument("--name", default=None, metavar="N", help="only the runs of this name")
    parser.add_argument(
        "--limit",
        type=count("runs", minimum=1),
        default=DEFAULT_LIMIT,
        metavar="K",
        help=f"list at most K runs, the newest (default {DEFAULT_LIMIT})",
    )
    add_json_arg(parser, SCHEMA)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.action == "compare":
        return _compare(args, out)
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
    """`history compare A B`: B against A, what changed first."""
    if len(args.run_ids) != 2:
        raise UsageError(
            f"history compare takes two run ids, not {len(args.run_ids)}",
            hint="`loaderdoctor history compare A B` shows what changed from run A to run B; `loaderdoctor history` "
            "lists the runs with their ids",
        )
    comparison = compare_runs(find_run(args.run_ids[0]), find_run(args.run_ids[1]))
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2, allow_nan=False, default=str))
    else:
        compare_render.render(comparison, out)
    return 0


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
