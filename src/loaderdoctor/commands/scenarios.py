"""`loaderdoctor scenarios`: list the built-in scenarios, one line each."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from loaderdoctor import scenarios

NAME = "scenarios"
SCHEMA = None


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser(NAME, help="list the built-in scenarios")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.add_column("scenario", style="bold", no_wrap=True)
    table.add_column("what it is")
    table.add_column("planted cause", no_wrap=True)
    for scenario in scenarios.all_scenarios():
        cause = scenario.planted_cause or "none"
        if scenario.found_by != "check":
            cause += f" ({scenario.found_by})"
        table.add_row(f"scenario:{scenario.name}", scenario.summary, cause)
    out.print(table)
    return 0
