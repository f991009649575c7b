"""The kinds of report (check, tune, scale), one entry each: its schema, its class, and how it is shown on the
console and as an HTML page. A new kind of report is one entry here (docs/ARCHITECTURE.md says what else)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from loaderdoctor.render import console as check_console
from loaderdoctor.render import scale as scale_console
from loaderdoctor.render import tune as tune_console
from loaderdoctor.render.html import check as check_page
from loaderdoctor.render.html import scale as scale_page
from loaderdoctor.render.html import tune as tune_page
from loaderdoctor.report import SCHEMA as CHECK_SCHEMA
from loaderdoctor.report import Report
from loaderdoctor.scale.report import SCHEMA as SCALE_SCHEMA
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.tune.result import SCHEMA as TUNE_SCHEMA
from loaderdoctor.tune.result import TuneReport


@dataclass(frozen=True)
class ReportKind:
    schema: str  # the JSON's "schema"
    report: type  # the class whose from_dict rebuilds it
    console: Callable[[Any, Console], None]  # shows it on a console
    page: Callable[[Any], str]  # its self-contained HTML page


KINDS: tuple[ReportKind, ...] = (
    ReportKind(CHECK_SCHEMA, Report, check_console.render, check_page.page),
    ReportKind(TUNE_SCHEMA, TuneReport, tune_console.render, tune_page.page),
    ReportKind(SCALE_SCHEMA, ScaleReport, scale_console.render, scale_page.page),
)
BY_SCHEMA = {kind.schema: kind for kind in KINDS}


def kind_of(report: object) -> ReportKind:
    """The kind a report is of."""
    for kind in KINDS:
        if isinstance(report, kind.report):
            return kind
    raise TypeError(f"not a report of check, tune or scale: a {type(report).__name__}")


def report_page(report: object) -> str:
    """The self-contained HTML page of a check, tune or scale report."""
    return kind_of(report).page(report)
