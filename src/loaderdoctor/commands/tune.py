"""`loaderdoctor tune`: search the fastest safe settings of each loader of a target by measuring them."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from loaderdoctor.commands.arguments import (
    add_budget_arg,
    add_history_arg,
    add_json_arg,
    add_step_arg,
    add_target_args,
    count,
)
from loaderdoctor.commands.measuring import run_measuring
from loaderdoctor.commands.showing import add_html_arg
from loaderdoctor.kinds import BY_NAME
from loaderdoctor.render.progress import LiveProgress
from loaderdoctor.tune import tune
from loaderdoctor.tune.run import DEFAULT_BUDGET_S

NAME = "tune"
SCHEMA = BY_NAME[NAME].schema


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help="search the fastest safe settings by measuring them")
    add_target_args(parser, "tune")
    add_budget_arg(parser, DEFAULT_BUDGET_S, "searching in all, shared by the loaders")
    parser.add_argument(
        "--memory-budget",
        default=None,
        metavar="SIZE",
        help="most memory loading may use: workers plus batches in flight, e.g. 8G (default: half of the "
        "memory available)",
    )
    add_step_arg(parser, "; then the cheapest settings that keep up with it win")
    parser.add_argument(
        "--max-workers",
        type=count("workers", minimum=1),
        default=None,
        metavar="N",
        help="never try more workers than N",
    )
    parser.add_argument("--quick", action="store_true", help="only climb the worker counts (fewer, shorter trials)")
    add_json_arg(parser, SCHEMA)
    add_html_arg(parser)
    add_history_arg(parser)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Tune, and show the report; on Ctrl-C or SIGTERM, the trials measured so far and status 130 or 143."""

    def measure(live: LiveProgress) -> Any:
        return tune(
            args.target,
            budget_s=args.budget,
            memory_budget=args.memory_budget,
            step_ms=args.step_ms,
            quick=args.quick,
            max_workers=args.max_workers,
            progress=live.tune_update,
        )

    stopped = "the trials measured before {by} (nothing chosen for the loader interrupted)"
    return run_measuring(NAME, args, out, err, measure, stopped=stopped, budget_s=args.budget)
