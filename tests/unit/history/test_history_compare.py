"""`loaderdoctor history compare A B`: what changed from run A to run B, likeliest cause first, then the two
side by side; on hand-made RunRecords saved to a private history."""

from __future__ import annotations

import dataclasses
import json

from test_degradation import HOG, HOG_2, make_host, make_run

from loaderdoctor.cli import main
from loaderdoctor.history.compare import SCHEMA, compare_runs
from loaderdoctor.history.store import save_run
from loaderdoctor.loader.settings import Settings


def _slowed_pair():
    normal = make_run(40.0, run_id=1)
    slowed = make_run(10.0, run_id=2, host=make_host(other_processes=[HOG, HOG_2], load_avg_1m=2.4), wait_fraction=0.7)
    return normal, slowed


def test_a_slowed_run_names_the_processes_that_took_its_cores_first():
    normal, slowed = _slowed_pair()
    comparison = compare_runs(normal, slowed)
    assert comparison.ratio == 0.25 and comparison.unit == "batches_per_s"
    assert comparison.changes[0].what == "other_processes"
    assert "pid 4242" in comparison.changes[0].words
    differing = {row.what for row in comparison.rows if row.differs}
    assert {"batches/s", "waiting", "other processes", "load (1 min)"} <= differing
    assert "num_workers" not in differing  # the settings stayed


def test_changed_settings_are_a_change_and_a_differing_row():
    normal = make_run(40.0, run_id=1)
    changed = dataclasses.replace(make_run(20.0, run_id=2), settings=Settings(num_workers=0).to_dict())
    comparison = compare_runs(normal, changed)
    assert comparison.changes[0].what == "settings"
    assert next(row for row in comparison.rows if row.what == "num_workers").differs


def test_the_command_line_shows_the_cause_before_the_table(capsys):
    normal, slowed = (dataclasses.replace(run, id=None) for run in _slowed_pair())
    a, b = save_run(normal), save_run(slowed)
    assert main(["history", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "10.0 batches/s against 40.0: 4.0x slower (25% of run" in out
    cause, table = out.index("1. other processes took"), out.index("other processes  ")
    assert cause < table
    assert main(["history", "compare", str(a), "latest", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == SCHEMA and document["ratio"] == 0.25
    assert document["changes"][0]["what"] == "other_processes" and document["changes"][0]["fix"]


def test_two_runs_alike_say_nothing_changed(capsys):
    a, b = save_run(make_run(40.0)), save_run(make_run(39.5))
    assert main(["history", "compare", str(a), str(b)]) == 0
    assert "No measured change between them" in capsys.readouterr().out


def test_compare_needs_two_runs(capsys):
    assert main(["history", "compare", "1"]) == 2
    assert "history compare takes two run ids, not 1" in capsys.readouterr().err
