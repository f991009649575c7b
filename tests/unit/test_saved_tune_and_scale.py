"""A tune report and a scale report written by loaderdoctor and kept (issue 34) load, show on the console and as
HTML, and print back the very JSON they were saved as: a change to their schemas that old reports cannot follow
fails here (as test_saved_before_the_move.py does for a check report and a history)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loaderdoctor.cli import main
from loaderdoctor.saved import read_report
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.tune.result import TuneReport

SAVED = Path(__file__).parent / "saved"
# `loaderdoctor tune demo --budget 20 --quick --json --no-history` at a0702f8 (with the move's working tree)
TUNE_REPORT = SAVED / "tune-a0702f8.json"
# `loaderdoctor scale demo --ranks 1,2 --budget 4 --json --no-history` at a0702f8 (with the move's working tree)
SCALE_REPORT = SAVED / "scale-a0702f8.json"


def test_a_saved_tune_report_loads_as_it_was_written():
    saved = json.loads(TUNE_REPORT.read_text())
    report = read_report(TUNE_REPORT)
    assert isinstance(report, TuneReport) and report.target == saved["target"]
    assert list(report.loaders) == list(saved["loaders"]) and report.loaders
    for name, tuning in report.loaders.items():
        written = saved["loaders"][name]
        assert [trial.number for trial in tuning.trials] == [trial["number"] for trial in written["trials"]]
        assert tuning.chosen.number == written["chosen"]["number"]
        assert tuning.chosen in tuning.trials  # the very trial of the list, as the renderers tell it by identity
        assert tuning.settings.snippet() == written["snippet"]


def test_a_saved_scale_report_loads_as_it_was_written():
    saved = json.loads(SCALE_REPORT.read_text())
    report = read_report(SCALE_REPORT)
    assert isinstance(report, ScaleReport) and report.target == saved["target"]
    assert list(report.loaders) == list(saved["loaders"]) and report.loaders
    for name, scaled in report.loaders.items():
        written = saved["loaders"][name]
        assert [run.ranks for run in scaled.runs] == [run["ranks"] for run in written["runs"]]
        assert [f.rule for f in scaled.findings] == [f["rule"] for f in written["findings"]]
        assert (scaled.plan is None) == (written["plan"] is None)


@pytest.mark.parametrize("path", [TUNE_REPORT, SCALE_REPORT], ids=["tune", "scale"])
def test_a_saved_tune_or_scale_report_shows_and_prints_back_as_it_was(path, tmp_path, capsys):
    saved = json.loads(path.read_text())
    loader = next(iter(saved["loaders"]))
    page = tmp_path / "page.html"
    assert main(["report", str(path), "--html", str(page)]) == 0
    shown = capsys.readouterr().out
    assert f"loader '{loader}'" in shown, shown
    assert page.stat().st_size > 10_000 and loader in page.read_text()
    assert main(["report", str(path), "--json"]) == 0
    assert _without_added_fields(json.loads(capsys.readouterr().out)) == saved


# Fields added since these reports were written, at the value a report written before them loads with.
ADDED_SINCE = {"ready_cores": None, "loader_class": ""}  # a run's ready cores; the loader's own class


def _without_added_fields(data: object) -> object:
    if isinstance(data, dict):
        return {
            key: _without_added_fields(value)
            for key, value in data.items()
            if not (key in ADDED_SINCE and value == ADDED_SINCE[key])
        }
    if isinstance(data, list):
        return [_without_added_fields(item) for item in data]
    return data


def test_a_tie_between_what_binds_a_trials_runs_goes_to_the_earliest_run_in_every_process():
    tuning = read_report(TUNE_REPORT).loaders["train"]
    trial = tuning.limit_trial
    assert trial is not None and [run.limit_binds for run in trial.runs] == ["step", "loading-cpu"]  # a tie
    assert tuning.limit_dict()["binds"] == "step"
    trial.runs.reverse()
    assert tuning.limit_dict()["binds"] == "loading-cpu"  # by the runs' order, not by a set's (per process)
