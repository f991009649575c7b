"""The kinds of report, one entry each: the command that makes it, its JSON schema and its class. A new kind of
report is one entry here, one in render/kinds.py (how it is shown) and one in history/reports.py (the runs it
keeps); the saved reports, the trackers and the stop's words read this one."""

from __future__ import annotations

from dataclasses import dataclass

from loaderdoctor.report import SCHEMA as CHECK_SCHEMA
from loaderdoctor.report import Report
from loaderdoctor.scale.report import SCHEMA as SCALE_SCHEMA
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.tune.result import SCHEMA as TUNE_SCHEMA
from loaderdoctor.tune.result import TuneReport

AnyReport = Report | TuneReport | ScaleReport


@dataclass(frozen=True)
class Kind:
    name: str  # the command that makes it: "check", "tune", "scale" (a check's Report of `run` says so itself)
    schema: str  # the JSON's "schema"
    report: type  # the class whose from_dict rebuilds it


KINDS: tuple[Kind, ...] = (
    Kind("check", CHECK_SCHEMA, Report),
    Kind("tune", TUNE_SCHEMA, TuneReport),
    Kind("scale", SCALE_SCHEMA, ScaleReport),
)
BY_SCHEMA = {kind.schema: kind for kind in KINDS}
BY_NAME = {kind.name: kind for kind in KINDS}


def kind_of(report: object) -> Kind:
    """The kind a report is of; a TypeError that says so for anything else."""
    for kind in KINDS:
        if isinstance(report, kind.report):
            return kind
    raise TypeError(f"not a report of check, tune or scale: a {type(report).__name__}")
