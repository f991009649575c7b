"""render/kinds.py: the one registry of report kinds that loading, the console and the HTML page all read."""

from __future__ import annotations

import pytest
from rich.console import Console
from test_report_roundtrip import _check_report, _scale_report, _tune_report

from loaderdoctor import saved
from loaderdoctor.render import kinds


@pytest.mark.parametrize("build", [_check_report, _tune_report, _scale_report])
def test_each_kind_loads_shows_and_pages_through_its_one_entry(build):
    report = build()
    kind = kinds.kind_of(report)
    assert report.to_dict()["schema"] == kind.schema
    assert saved.SCHEMAS[kind.schema] is kind.report  # loading reads the same entry
    loaded = saved.load_report(report.to_dict())
    assert type(loaded) is kind.report
    console = Console(record=True, width=120)
    kind.console(loaded, console)
    assert console.export_text().strip()
    assert kinds.report_page(loaded).startswith("<!DOCTYPE html>")


def test_a_thing_that_is_no_report_is_refused_by_name():
    with pytest.raises(TypeError, match="not a report of check, tune or scale: a dict"):
        kinds.kind_of({})
