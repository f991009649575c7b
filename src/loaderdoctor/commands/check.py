"""`loaderdoctor check`: measure each loader of a target, name the causes, and measure the fix."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from loaderdoctor.check import DEFAULT_BUDGET_S, DEFAULT_EPOCHS, check
from loaderdoctor.commands.arguments import (
    add_budget_arg,
    add_history_arg,
    add_json_arg,
    add_step_arg,
    add_target_args,
    count,
    number,
)
from loaderdoctor.commands.measuring import run_measuring
from loaderdoctor.commands.showing import add_html_arg
from loaderdoctor.kinds import BY_NAME
from loaderdoctor.render.progress import LiveProgress

NAME = "check"
SCHEMA = BY_NAME[NAME].schema


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(NAME, help="measure a loader, name the cause, and measure the fix")
    add_target_args(parser, "check")
    add_budget_arg(parser, DEFAULT_BUDGET_S, "measuring in all, the fix's run included")
    parser.add_argument(
        "--epochs",
        type=count("epochs", minimum=1),
        default=DEFAULT_EPOCHS,
        metavar="N",
        help=f"epochs to run at most per measurement (default {DEFAULT_EPOCHS})",
    )
    add_step_arg(parser)
    add_json_arg(parser, SCHEMA)
    add_html_arg(parser)
    add_history_arg(parser)
    parser.add_argument("--no-verify", action="store_true", help="do not measure the prescribed settings")
    parser.add_argument(
        "--epoch-batches",
        type=count("batches", minimum=1),
        default=None,
        metavar="N",
        help="batches in an epoch of your training, for its time now and with the fix (default: the loader's length)",
    )
    parser.add_argument(
        "--cost-per-hour",
        type=number("money per hour", minimum=0),
        default=None,
        metavar="X",
        help="what an hour of the job costs (e.g. its GPUs): the report says what an epoch costs now and with the fix",
    )


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Check, and show the report; on Ctrl-C or SIGTERM, what was measured so far and status 130 or 143."""

    def measure(live: LiveProgress) -> Any:
        return check(
            args.target,
            budget_s=args.budget,
            epochs=args.epochs,
            step_ms=args.step_ms,
            verify_fix=not args.no_verify,
            progress=live.check_update,
            epoch_batches=args.epoch_batches,
            cost_per_hour=args.cost_per_hour,
        )

    stopped = "what was measured before {by} (no fix verified for the loader interrupted)"
    return run_measuring(NAME, args, out, err, measure, stopped=stopped, budget_s=args.budget)
