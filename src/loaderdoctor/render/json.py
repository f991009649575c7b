"""The JSON rendering of a check Report (schema "loaderdoctor.check/1"), a TuneReport ("loaderdoctor.tune/1") or
a ScaleReport ("loaderdoctor.scale/1")."""

from __future__ import annotations

import json

from loaderdoctor.report import Report
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.tune.result import TuneReport


def render(report: Report | TuneReport | ScaleReport) -> str:
    return json.dumps(report.to_dict(), indent=2, allow_nan=False)
