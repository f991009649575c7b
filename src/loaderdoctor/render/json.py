"""The JSON rendering of a check Report (schema "loaderdoctor.check/1") or a TuneReport ("loaderdoctor.tune/1")."""

from __future__ import annotations

import json

from loaderdoctor.report import Report
from loaderdoctor.tune.result import TuneReport


def render(report: Report | TuneReport) -> str:
    return json.dumps(report.to_dict(), indent=2, allow_nan=False)
