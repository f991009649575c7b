"""How each kind of report (kinds.py) is shown: on a console and as a self-contained HTML page. A new kind of
report is one entry here too (docs/ARCHITECTURE.md says what else)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from loaderdoctor import kinds
from loaderdoctor.render import console as check_console
from loaderdoctor.render import scale as scale_console
from loaderdoctor.render import tune as tune_console
from loaderdoctor.render.html import check as check_page
from loaderdoctor.render.html import scale as scale_page
from loaderdoctor.render.html import tune as tune_page


@dataclass(frozen=True)
class ReportKind:
    schema: str  # the JSON's "schema"
    report: type  # the class whose from_dict rebuilds it
    console: Callable[[Any, Console], None]  # shows it on a console
    page: Callable[[Any], str]  # its self-contained HTML page


_SHOWN: dict[str, tuple[Callable[[Any, Console], None], Callable[[Any], str]]] = {
    "check": (check_console.render, check_page.page),
    "tune": (tune_console.render, tune_page.page),
    "scale": (scale_console.render, scale_page.page),
}
KINDS: tuple[ReportKind, ...] = tuple(ReportKind(kind.schema, kind.report, *_SHOWN[kind.name]) for kind in kinds.KINDS)
BY_SCHEMA = {kind.schema: kind for kind in KINDS}


def kind_of(report: object) -> ReportKind:
    """How a report is shown, by the kind it is of."""
    return BY_SCHEMA[kinds.kind_of(report).schema]


def report_page(report: object) -> str:
    """The self-contained HTML page of a check, tune or scale report."""
    return kind_of(report).page(report)
