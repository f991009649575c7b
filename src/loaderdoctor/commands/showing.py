"""How a report of check, tune or scale is shown: on the console or as JSON, and as an HTML page with --html; a
live report is shown from its plain data (as `loaderdoctor report saved.json` shows it), so that both read alike."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import TextIO

from rich.console import Console

from loaderdoctor.commands.running import log_to_trackers
from loaderdoctor.errors import UsageError
from loaderdoctor.kinds import AnyReport
from loaderdoctor.render import html
from loaderdoctor.render import json as json_render
from loaderdoctor.render.html.inline import inline_frame
from loaderdoctor.render.kinds import KINDS, kind_of, report_page
from loaderdoctor.render.terminal import SafeConsole
from loaderdoctor.report import LoaderReport
from loaderdoctor.saved import as_saved, for_console


def add_html_arg(parser: argparse.ArgumentParser) -> None:
    """--html FILE: also write the report as a self-contained HTML page."""
    parser.add_argument(
        "--html",
        type=html_file,
        default=None,
        metavar="FILE",
        help="also write the report as one self-contained HTML page (charts included, nothing loaded from the network)",
    )


def html_file(text: str) -> Path:
    """An argparse type: a file whose folder exists (checked before any measuring, not after it)."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"must be a file to write, not the folder {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"must be a file in a folder that exists; {str(path.parent)!r} does not")
    return path


def show(report: AnyReport, args: argparse.Namespace, out: Console, err: Console) -> None:
    """Print the report (JSON with --json, else on the console), write its page with --html, and log it to the
    trackers of --log-to."""
    shown = as_saved(report)
    if args.html is not None:
        html.write_page(report_page(shown), args.html)
    if args.json:
        print(json_render.render(shown))
    else:
        render_console(for_console(shown), out)
    if args.html is not None:
        err.print(f"HTML report written to {args.html}", highlight=False, markup=False)
    log_to_trackers(shown, getattr(args, "log_to", None) or [], err)


def render_console(report: AnyReport, out: Console) -> None:
    """The report on the console, as its kind shows it (render/kinds.py)."""
    kind_of(report).console(report, out)


def show_report(
    report: AnyReport | LoaderReport, *, file: TextIO | None = None, html_path: str | Path | None = None
) -> None:
    """Print a report of check, tune or scale as the command line shows it (from its plain data, control
    characters made visible), to `file` (default: standard output); with `html_path`, also write its page there.
    The public `loaderdoctor.show`: a notebook's readable view of what check() or tune() returned, or of one
    loader's report (watch's, a callback's)."""
    if isinstance(report, LoaderReport):
        report = report.as_report()
    kind_of(report)  # a TypeError that says so for anything else
    path = None
    if html_path is not None:
        try:
            path = html_file(str(html_path))
        except argparse.ArgumentTypeError as error:
            raise UsageError(f"html_path {error}", hint="give a file in a folder that exists") from None
    shown = as_saved(report)
    if path is not None:
        html.write_page(report_page(shown), path)
    render_console(for_console(shown), SafeConsole(highlight=False, file=file or sys.stdout))


def report_text(report: AnyReport) -> str:
    """The report as show() prints it, as plain text (no colour, control characters made visible): str(report)."""
    buffer = io.StringIO()
    console = SafeConsole(highlight=False, file=buffer, force_terminal=False, force_jupyter=False, no_color=True)
    render_console(for_console(as_saved(report)), console)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"  # no column's padding


def report_html(report: AnyReport) -> str:
    """The report's HTML page in a sandboxed iframe: what a notebook shows of a report (its _repr_html_)."""
    shown = as_saved(report)
    return inline_frame(report_page(shown), title=f"loaderdoctor report of {shown.target}")


# A report shows itself (a notebook calls _repr_html_, print() calls __str__), but its class lives below render/
# (tests/unit/test_layers.py): the views are lent to each kind's class from here, a layer above both, which
# `import loaderdoctor` always loads; no lower module imports a renderer, lazily or not.
for _kind in KINDS:
    _kind.report._repr_html_ = report_html
    _kind.report.__str__ = report_text
# One loader's report (what watch() and the callbacks give) shows as the report of its own it makes.
LoaderReport._repr_html_ = lambda self: report_html(self.as_report())  # type: ignore[attr-defined]
LoaderReport.__str__ = lambda self: report_text(self.as_report())  # type: ignore[method-assign]
