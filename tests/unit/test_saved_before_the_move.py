"""A report and a history written by loaderdoctor before its modules moved into folders (a8c0f6b, issue 34) load
and show after it: neither holds a module path, and nothing of their schemas changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from loaderdoctor.cli import main
from loaderdoctor.history.store import FILE_NAME, load_runs
from loaderdoctor.report import Report
from loaderdoctor.saved import read_report

SAVED = Path(__file__).parent / "saved"
CHECK_REPORT = SAVED / "check-a8c0f6b.json"  # `loaderdoctor check demo --budget 12 --json` at a8c0f6b
HISTORY = SAVED / "history-a8c0f6b.sqlite3"  # the history that check kept


def test_a_check_report_saved_before_the_move_loads_shows_and_prints_back_as_it_was(tmp_path, capsys):
    saved = json.loads(CHECK_REPORT.read_text())
    report = read_report(CHECK_REPORT)
    assert isinstance(report, Report) and list(report.loaders) == list(saved["loaders"])
    for name, loader in report.loaders.items():
        assert [f.rule for f in loader.findings] == [f["rule"] for f in saved["loaders"][name]["findings"]]
    assert main(["report", str(CHECK_REPORT), "--html", str(tmp_path / "page.html")]) == 0
    shown = capsys.readouterr().out
    assert "input-bound" in shown and (tmp_path / "page.html").stat().st_size > 10_000
    assert main(["report", str(CHECK_REPORT), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert _without_added_fields(again) == _without_added_fields(saved)
    measured = again["loaders"]["train"]["measurements"]
    assert measured["wait_fraction"] > saved["loaders"]["train"]["measurements"]["wait_fraction"]
    assert measured["wait_descheduled_ms_mean"] is None


# Fields added since the fixture was written, at their defaults: the only difference allowed.
ADDED_SINCE = {
    "step_run_delay_s": None,
    "unsteady": False,
    "fixed_speedup_range": None,
    "fixed_epoch_s_range": None,
    "ceiling": None,
    "ceiling_batches_per_s": None,  # a verification's, with the loop's ceiling (and the two shares of it below)
    "ceiling_windows": 0,
    "share_of_ceiling": None,
    "before_share_of_ceiling": None,
    "unwatched": [],  # a run's processes that could not be watched
    "restarts": 0,  # an epoch's: iterators a guard started again within it
    "after_restart": False,  # a batch's: one of the first after such a restart
    "sampler": "",  # a watched loader's sampler, and what its first epoch drew (run's ranks compare them)
    "sampler_distributed": None,
    "samples_per_epoch": None,
    "drawn_indices": None,
    "drawn_fingerprints": [],
    "loader_class": "",  # the loader's class when it is not torch's DataLoader itself
    "thread_cpu_s": None,  # a worker reading's: each of its threads' CPU
    "same_user": None,  # another process's: whether it runs as this run's user
}
# Measurements added since, which the report computes anew from the saved recording: present, of any value.
# And those whose reading changed since: this loader loads in the loop's own thread (num_workers=0), whose time
# descheduled in next() was loading's and is no longer left out of its wait (issue 49).
DERIVED_SINCE = {"batches_per_s_range", "wait_fraction", "wait_descheduled_ms_mean"}


def _without_added_fields(data: object) -> object:
    if isinstance(data, dict):
        return {
            key: _without_added_fields(value)
            for key, value in data.items()
            if not (key in ADDED_SINCE and value == ADDED_SINCE[key]) and key not in DERIVED_SINCE
        }
    if isinstance(data, list):
        return [_without_added_fields(item) for item in data]
    return data


def test_a_history_kept_before_the_move_lists_shows_and_compares(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOADERDOCTOR_HOME", str(tmp_path))
    shutil.copy(HISTORY, tmp_path / FILE_NAME)
    (run,) = load_runs()
    assert run.kind == "check" and run.name == "demo/train"
    assert run.findings and run.findings[0]["rule"] == "input-bound"
    assert main(["history"]) == 0 and "demo/train" in capsys.readouterr().out
    assert main(["report", "latest"]) == 0 and "input-bound" in capsys.readouterr().out
    assert main(["history", "compare", str(run.id), str(run.id)]) == 0
