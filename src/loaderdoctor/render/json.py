"""The JSON rendering of a check Report (schema "loaderdoctor.check/1")."""

from __future__ import annotations

import json

from loaderdoctor.report import Report


def render(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, allow_nan=False)
