"""`loaderdoctor report`: a report saved with --json shows on the console as the live one did, and writes the
same page with --html; a history run shows by id or 'latest'; bad sources get a clear error."""

from __future__ import annotations

import json
import os

import pytest
from recordings import make_recording

from loaderdoctor.cli import main
from loaderdoctor.commands import check as check_command
from loaderdoctor.history.records import RunRecord
from loaderdoctor.history.store import save_run
from loaderdoctor.loader.settings import Settings
from loaderdoctor.report import Finding, LoaderReport, Report, Verification
from loaderdoctor.saved import MAX_BYTES

FIXED = Settings(num_workers=2, persistent_workers=True)


def _report() -> Report:
    rec = make_recording(settings=Settings(), epochs=3, batches_per_epoch=25, wait_s=0.0512345, step_s=0.0201)
    after = make_recording(settings=FIXED, epochs=3, batches_per_epoch=25, wait_s=0.00213, step_s=0.0201)
    finding = Finding(
        "input-bound",
        "critical",
        "the step waits 71% of the time",
        {"wait_fraction": 0.7123456, "workers": [0]},
        "use 2 workers",
        snippet="DataLoader(num_workers=2)",
        settings_change={"num_workers": 2},
        impact=0.7,
    )
    fix = Verification(
        FIXED,
        14.04567,
        40.12345,
        "completed",
        "completed",
        "faster",
        "2.86x in 4 pairs",
        after_recording=after,
        spread=(2.7123, 2.9456),
        pairs=4,
    )
    return Report("demo", {"train": LoaderReport("train", rec, [finding], fix)})


@pytest.fixture
def checked(monkeypatch):
    """`loaderdoctor check` answering with the hand-made report, measuring nothing."""
    monkeypatch.setattr(check_command, "check", lambda *args, **kwargs: _report())


def test_a_saved_report_shows_as_the_live_one_did(checked, tmp_path, capsys):
    assert main(["check", "--no-history", "--html", str(tmp_path / "live.html")]) == 1
    live = capsys.readouterr().out
    assert main(["check", "--no-history", "--json"]) == 1
    saved = tmp_path / "saved.json"
    saved.write_text(capsys.readouterr().out)
    assert main(["report", str(saved), "--html", str(tmp_path / "saved.html")]) == 0
    shown = capsys.readouterr().out
    assert "loaderdoctor check demo" in live and "verified fix" in live
    assert shown == live
    pages = [(tmp_path / name).read_text() for name in ("live.html", "saved.html")]
    assert [_without_time(p) for p in pages[:1]] == [_without_time(p) for p in pages[1:]]


def _without_time(page: str) -> str:
    return page[: page.index("<footer>")]


def test_a_saved_report_prints_back_as_the_same_json(checked, tmp_path, capsys):
    main(["check", "--no-history", "--json"])
    first = capsys.readouterr().out
    saved = tmp_path / "saved.json"
    saved.write_text(first)
    main(["report", str(saved), "--json"])
    assert json.loads(capsys.readouterr().out) == json.loads(first)


def test_a_history_run_shows_by_id_and_as_latest(tmp_path, capsys):
    run = RunRecord(
        name="demo/train", kind="check", started_at="2026-11-25T10:00:00+00:00", ended_at="2026-11-25T10:00:30+00:00",
        host={}, settings=FIXED.to_dict(), measurements={"batches_per_s": 38.2}, findings=[], target="demo",
    )  # fmt: skip
    run_id = save_run(run)
    assert main(["report", "latest", "--html", str(tmp_path / "latest.html")]) == 0
    out = capsys.readouterr().out
    assert f"run {run_id} demo/train" in out and "38.2 batches/s" in out
    assert main(["report", str(run_id)]) == 0
    assert capsys.readouterr().out == out
    assert "Rate of each run" in (tmp_path / "latest.html").read_text()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "does not exist"),
        ("{not json", "not JSON"),
        ('{"schema": "loaderdoctor.check/1", "error": "bad target", "hint": "h"}', "error"),
        ('{"schema": "somebody.else/1"}', "loaderdoctor.check/1"),
    ],
)
def test_a_bad_source_says_what_is_wrong(tmp_path, capsys, content, said):
    source = tmp_path / "saved.json"
    if content is not None:
        source.write_text(content)
    assert main(["report", str(source)]) == 2
    assert said.lower() in capsys.readouterr().err.lower()


def test_html_into_a_folder_that_does_not_exist_is_refused_before_measuring(checked, tmp_path, capsys):
    assert main(["check", "--html", str(tmp_path / "missing" / "r.html")]) == 2
    assert "does not" in capsys.readouterr().err


def test_no_history_run_says_where_runs_come_from(capsys):
    assert main(["report", "latest"]) == 2
    assert "no runs yet" in capsys.readouterr().err


# A damaged or hostile saved report, or run id: one clear error and exit 2, never a traceback, a wait or a flood


def _saved(tmp_path, text: str):
    source = tmp_path / "saved.json"
    source.write_text(text)
    return source


def _marked(value: str) -> str:
    """The JSON text of the hand-made report with `value` (bare JSON) as the wait of the train loader's batch 3."""
    data = _report().to_dict()
    data["loaders"]["train"]["recording"]["batches"][3]["wait_s"] = "<here>"
    return json.dumps(data).replace('"<here>"', value)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('"slow"', "batches[3].wait_s: expected a number, got a string"),
        ("NaN", "batches[3].wait_s: NaN is no number (JSON has none)"),
        ("-Infinity", "batches[3].wait_s: -Infinity is no number (JSON has none)"),
        ("1e999", "batches[3].wait_s: the number 1e999 is out of range"),
        ("1" + "0" * 5000, "batches[3].wait_s: a number of 5001 digits is out of range"),
        ("[" * 40 + "]" * 40, "batches[3].wait_s[0][0]"),
    ],
)
def test_a_field_out_of_bounds_is_refused_with_its_path(tmp_path, capsys, value, said):
    assert main(["report", str(_saved(tmp_path, _marked(value)))]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert "loaders.train.recording.batches[3].wait_s" in first and said in first


def test_nesting_too_deep_for_the_parser_is_refused(tmp_path, capsys):
    assert main(["report", str(_saved(tmp_path, "[" * 100_000 + "]" * 100_000))]) == 2
    assert "nested far deeper than a report" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, capsys):
    fifo = tmp_path / "saved.json"
    os.mkfifo(fifo)
    assert main(["report", str(fifo)]) == 2
    assert "is a FIFO (a named pipe), not a file" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_a_device_or_a_folder_is_refused_unread(tmp_path, capsys):
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    assert main(["report", str(tmp_path / "zero.json")]) == 2
    assert "is a device, not a file" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "is a folder, not a file" in capsys.readouterr().err


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path, capsys):
    huge = tmp_path / "saved.json"
    with huge.open("wb") as file:
        file.truncate(MAX_BYTES + 1)  # sparse: no disk used
    assert main(["report", str(huge)]) == 2
    assert "larger than 64 MiB" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_a_very_long_string_is_cut_on_the_console_and_kept_whole_in_json(tmp_path, capsys):
    data = _report().to_dict()
    data["target"] = "demo " * 400_000  # 2 MB: rich takes seconds to wrap it
    source = _saved(tmp_path, json.dumps(data))
    assert main(["report", str(source)]) == 0
    shown = capsys.readouterr().out
    assert "[cut: 2,000,000 characters in all]" in shown and len(shown) < 100_000
    main(["report", str(source), "--json"])
    assert json.loads(capsys.readouterr().out)["target"] == data["target"]


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "99999999999999999999"],
        ["history", "show", "99999999999999999999"],
        ["history", "compare", "99999999999999999999", "1"],
    ],
)
def test_a_run_id_beyond_64_bits_is_no_run(argv, capsys):
    save_run(RunRecord(
        name="demo/train", kind="check", started_at="2026-11-25T10:00:00+00:00", ended_at="2026-11-25T10:00:30+00:00",
        host={}, settings=FIXED.to_dict(), measurements={}, findings=[], target="demo",
    ))  # fmt: skip
    assert main(argv) == 2
    assert "no run 99999999999999999999 in the history" in capsys.readouterr().err
