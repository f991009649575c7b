"""HTML reports: one self-contained page per report (check, tune, scale) or history run, written to a file."""

from __future__ import annotations

from pathlib import Path

from loaderdoctor.errors import UsageError
from loaderdoctor.render.html import check, scale, tune
from loaderdoctor.report import Report
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.tune.result import TuneReport


def report_page(report: Report | TuneReport | ScaleReport) -> str:
    """The page of a check, tune or scale report."""
    if isinstance(report, TuneReport):
        return tune.page(report)
    if isinstance(report, ScaleReport):
        return scale.page(report)
    return check.page(report)


def write_page(page: str, path: Path) -> None:
    """Write a page to `path`, with a clear error where it cannot be written."""
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as error:
        raise UsageError(
            f"cannot write the HTML report to {path}: {error.strerror or error}",
            hint="give --html a file in a folder that exists and that you may write to",
        ) from None
