"""The command line: parse arguments, call the library, render the result. main(argv) returns the exit status."""

from __future__ import annotations

import argparse
import logging
import math
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from loaderdoctor import scenarios
from loaderdoctor.check import DEFAULT_BUDGET_S, DEFAULT_EPOCHS, check
from loaderdoctor.errors import LoaderDoctorError, UsageError
from loaderdoctor.render import console as console_render
from loaderdoctor.render import json as json_render
from loaderdoctor.render import tune as tune_render
from loaderdoctor.render.progress import LiveProgress
from loaderdoctor.tune import tune
from loaderdoctor.tune.run import DEFAULT_BUDGET_S as TUNE_BUDGET_S

_TARGET_HELP = (
    "what to check: 'demo' (default), 'scenario:NAME', 'pkg.module:function' or 'path/to/file.py:function'; "
    "the function takes no arguments and returns a DataLoader, a dict of them, or a loaderdoctor.Workload"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, hint=f"see `{self.prog} --help`")


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number more than 0, not {text}")
    return value


def _not_negative(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of 0 or more, not {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loaderdoctor", description="Find out why a PyTorch training job waits on its data.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what loaderdoctor does")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    chk = sub.add_parser("check", help="measure a loader, name the cause, and measure the fix")
    chk.add_argument("target", nargs="?", default="demo", help=_TARGET_HELP)
    chk.add_argument(
        "--budget",
        type=_positive,
        default=DEFAULT_BUDGET_S,
        metavar="S",
        help=f"seconds of measuring in all, the fix's run included (default {DEFAULT_BUDGET_S:g})",
    )
    chk.add_argument(
        "--epochs",
        type=int,
        default=DEFAULT_EPOCHS,
        metavar="N",
        help=f"epochs to run at most per measurement (default {DEFAULT_EPOCHS})",
    )
    chk.add_argument(
        "--step-ms",
        type=_not_negative,
        default=None,
        metavar="MS",
        help="simulate a training step of MS milliseconds after each batch (overrides the target's)",
    )
    chk.add_argument("--json", action="store_true", help="print the report as JSON (schema loaderdoctor.check/1)")
    chk.add_argument("--no-verify", action="store_true", help="do not measure the prescribed settings")
    tun = sub.add_parser("tune", help="search the fastest safe settings by measuring them")
    tun.add_argument("target", nargs="?", default="demo", help=_TARGET_HELP.replace("what to check", "what to tune"))
    tun.add_argument(
        "--budget",
        type=_positive,
        default=TUNE_BUDGET_S,
        metavar="S",
        help=f"seconds of searching in all, shared by the loaders (default {TUNE_BUDGET_S:g})",
    )
    tun.add_argument(
        "--memory-budget",
        default=None,
        metavar="SIZE",
        help="most memory loading may use: workers plus batches in flight, e.g. 8G (default: half of the "
        "memory available)",
    )
    tun.add_argument(
        "--step-ms",
        type=_not_negative,
        default=None,
        metavar="MS",
        help="simulate a training step of MS milliseconds after each batch; then the cheapest settings that "
        "keep up with it win (overrides the target's step)",
    )
    tun.add_argument("--max-workers", type=int, default=None, metavar="N", help="never try more workers than N")
    tun.add_argument("--quick", action="store_true", help="only climb the worker counts (fewer, shorter trials)")
    tun.add_argument("--json", action="store_true", help="print the result as JSON (schema loaderdoctor.tune/1)")
    sub.add_parser("scenarios", help="list the built-in scenarios")
    return parser


def _check(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.epochs < 1:
        raise UsageError(f"--epochs must be 1 or more, not {args.epochs}")
    with LiveProgress(err) as live:
        report = check(
            args.target,
            budget_s=args.budget,
            epochs=args.epochs,
            step_ms=args.step_ms,
            verify_fix=not args.no_verify,
            progress=live.check_update,
        )
    if args.json:
        print(json_render.render(report))
    else:
        console_render.render(report, out)
    return report.exit_status


def _tune(args: argparse.Namespace, out: Console, err: Console) -> int:
    with LiveProgress(err) as live:
        report = tune(
            args.target,
            budget_s=args.budget,
            memory_budget=args.memory_budget,
            step_ms=args.step_ms,
            quick=args.quick,
            max_workers=args.max_workers,
            progress=live.tune_update,
        )
    if args.json:
        print(json_render.render(report))
    else:
        tune_render.render(report, out)
    return report.exit_status


def _scenarios(out: Console) -> int:
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.add_column("scenario", style="bold", no_wrap=True)
    table.add_column("what it is")
    table.add_column("planted cause", no_wrap=True)
    for scenario in scenarios.all_scenarios():
        table.add_row(f"scenario:{scenario.name}", scenario.summary, scenario.planted_cause or "none")
    out.print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line with `argv` (sys.argv[1:] by default); return the exit status."""
    out = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    try:
        args = _parser().parse_args(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="loaderdoctor: %(levelname)s: %(message)s",
        )
        if args.command == "scenarios":
            return _scenarios(out)
        if args.command == "tune":
            return _tune(args, out, err)
        return _check(args, out, err)
    except LoaderDoctorError as error:
        # soft_wrap: a path or a file:line in a message must not be broken by an inserted newline
        err.print(f"[bold red]error:[/] {escape(error.message)}", soft_wrap=True)
        if error.hint:
            err.print(f"[dim]hint:[/] {escape(error.hint)}", soft_wrap=True)
        return error.exit_status
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
