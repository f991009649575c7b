"""`loaderdoctor report SOURCE`: show again a report saved with --json, or a run of the history (an id or
`latest`), on the console, as JSON, or as an HTML page with --html; a saved report logged to a tracker with
--log-to."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from loaderdoctor.commands.arguments import add_json_arg, add_log_to_arg
from loaderdoctor.commands.history import SCHEMA as HISTORY_SCHEMA
from loaderdoctor.commands.history import find_run
from loaderdoctor.commands.showing import add_html_arg, show
from loaderdoctor.errors import UsageError
from loaderdoctor.history.store import load_runs
from loaderdoctor.render import history as history_render
from loaderdoctor.render import html
from loaderdoctor.render.html import history as history_page
from loaderdoctor.saved import read_report

NAME = "report"
SCHEMA = None  # --json prints the report in its own schema (check, tune, scale) or a history run's
# The earlier runs of a name that a history run's page draws its trend from, at most.
TREND_RUNS = 50


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        NAME,
        help="show a saved --json report, or a run of the history, again (on the console, as JSON, or --html)",
        description=(
            "Show a report again: SOURCE is a file saved with `--json` (check, tune or scale), a run id of "
            "`loaderdoctor history`, or 'latest'."
        ),
    )
    parser.add_argument("source", metavar="SOURCE", help="a saved --json report, a history run id, or 'latest'")
    add_json_arg(parser, "of the report, or loaderdoctor.history/1 for a run")
    add_html_arg(parser)
    add_log_to_arg(parser)


def is_history_run(source: str) -> bool:
    """Whether SOURCE names a run of the history (a whole number or 'latest') rather than a file."""
    return source == "latest" or (source.isdigit() and not Path(source).exists())


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if not is_history_run(args.source):
        report = read_report(Path(args.source))
        show(report, args, out, err)
        return 0
    if args.log_to:
        raise UsageError(
            "--log-to logs a saved report (check, tune, scale or run), not a run of the history",
            hint="save the report with --json, or give --log-to to the command that measures it",
        )
    record = find_run(args.source).to_dict()
    if args.html is not None:
        earlier = [r.to_dict() for r in load_runs(name=record["name"], limit=TREND_RUNS)]
        html.write_page(history_page.page(record, earlier), args.html)
    if args.json:
        print(json.dumps({"schema": HISTORY_SCHEMA, "runs": [record]}, indent=2, allow_nan=False))
    else:
        history_render.render_run(record, out)
    if args.html is not None:
        err.print(f"HTML report written to {args.html}", highlight=False, markup=False)
    return 0
