"""`loaderdoctor scenarios`: list the built-in scenarios, a table where the terminal is wide enough, else each
scenario's name over its summary."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from loaderdoctor import scenarios
from loaderdoctor.render.columns import GAP, column_widths, line, line_width, wrapped_lines

NAME = "scenarios"
SCHEMA = None


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser(NAME, help="list the built-in scenarios")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    rows = [(f"scenario:{scenario.name}", scenario.summary, _cause(scenario)) for scenario in scenarios.all_scenarios()]
    widths = column_widths([[name, cause] for name, _, cause in [_HEADERS, *rows]])
    room = out.width - line_width(widths) - GAP
    if max(wrapped_lines(summary, room, out) for _, summary, _ in rows) <= _MOST_LINES:
        _table(rows, out)
        return 0
    # Too narrow for the summaries beside the names: each scenario's line, its summary under it.
    out.print(line([_HEADERS[0], _HEADERS[2]], widths, ("left", "left")), style="bold")
    for name, summary, cause in rows:
        out.print(line([Text(name, style="bold"), cause], widths, ("left", "left")))
        out.print(Padding(Text(summary), (0, 0, 0, 4)))
    return 0


_HEADERS = ("scenario", "what it is", "planted cause")
_MOST_LINES = 2  # a summary wrapped into more lines than this beside its name takes lines of its own


def _cause(scenario: scenarios.Scenario) -> str:
    """The planted cause, and the command that finds it where that is not check."""
    cause = scenario.planted_cause or "none"
    return cause if scenario.found_by == "check" else f"{cause} ({scenario.found_by})"


def _table(rows: list[tuple[str, str, str]], out: Console) -> None:
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.add_column(_HEADERS[0], style="bold", no_wrap=True)
    table.add_column(_HEADERS[1])
    table.add_column(_HEADERS[2], no_wrap=True)
    for row in rows:
        table.add_row(*row)
    out.print(table)
