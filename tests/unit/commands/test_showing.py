"""A report in a notebook: `repr()` is a line per loader, and `loaderdoctor.show(report)` prints it as the command
line does (any kind, control characters made visible), with its HTML page where asked."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from recordings import make_recording

import loaderdoctor
from loaderdoctor.errors import UsageError
from loaderdoctor.report import Finding, LoaderReport, Report
from loaderdoctor.saved import read_report

SAVED = Path(__file__).parents[1] / "saved"


def _report() -> Report:
    finding = Finding(
        "input-bound", "critical", "The training step waits for data 63% of the time", {"wait_fraction": 0.63},
        "use 2 workers", snippet=None, settings_change={"num_workers": 2}, impact=0.63,
    )  # fmt: skip
    loaders = {"train": LoaderReport("train", make_recording(), [finding], None)}
    loaders["val\x1b[2J"] = LoaderReport("val\x1b[2J", make_recording(), [], None)
    return Report("train.py", loaders)


def test_a_reports_repr_is_a_line_per_loader_not_every_batch():
    text = repr(_report())
    assert len(text.splitlines()) == 4 and len(text) < 400
    assert "'train': critical input-bound" in text and "no problems found" in text
    assert "loaderdoctor.show(report)" in text
    saved = read_report(SAVED / "check-a8c0f6b.json")
    assert "fix faster 4.30x" in repr(saved)  # a verified fix's verdict and speedup


def test_show_prints_any_kind_as_the_command_line_does_and_writes_the_page(tmp_path):
    out = io.StringIO()
    loaderdoctor.show(_report(), file=out, html_path=tmp_path / "r.html")
    text = out.getvalue()
    assert "loaderdoctor check train.py" in text and "critical input-bound" in text
    assert "\x1b[2J" not in text and "\\x1b[2J" in text  # a hostile name made visible
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    for saved in ("tune-a0702f8.json", "scale-a0702f8.json"):
        out = io.StringIO()
        loaderdoctor.show(read_report(SAVED / saved), file=out)
        assert "loader 'train'" in out.getvalue()


def test_show_refuses_what_is_no_report_and_a_page_with_nowhere_to_go(tmp_path):
    with pytest.raises(TypeError, match="not a report of check, tune or scale"):
        loaderdoctor.show({"schema": "loaderdoctor.check/1"})
    with pytest.raises(UsageError, match="html_path"):
        loaderdoctor.show(_report(), file=io.StringIO(), html_path=tmp_path / "no" / "such" / "r.html")


def test_one_loaders_report_shows_as_a_report_of_its_own():
    """What watch() and the trainer callbacks return: its repr is the short one, show() and print() give the
    console text, a notebook its page (not the dataclass of every batch)."""
    loader = _report().loaders["train"]
    text = repr(loader)
    assert text.startswith("<loaderdoctor run of 'train'") and "'train': critical input-bound" in text
    assert "Recording(" not in text and len(text) < 300
    out = io.StringIO()
    loaderdoctor.show(loader, file=out)
    assert "loader 'train'" in out.getvalue() and "critical input-bound" in out.getvalue()
    assert str(loader).splitlines() == [line.rstrip() for line in out.getvalue().splitlines()]
    assert loader._repr_html_().startswith("<iframe sandbox")
