"""Untrusted text never reaches the terminal raw: escape sequences in a loader's name, a dataset's class, an
error's message or a saved report are shown as visible escapes by the console every command prints through."""

from __future__ import annotations

import io
import json

from recordings import make_recording

from loaderdoctor.cli import main
from loaderdoctor.render.console import render
from loaderdoctor.render.terminal import SafeConsole, visible
from loaderdoctor.report import Finding, LoaderReport, Report

TITLE = "\x1b]0;owned\x07"  # sets the terminal's title
CLEAR = "\x1b[2J\x1b[H"  # clears the screen
CSI = "\x9b31m"  # C1: ESC [ in one byte


def test_control_characters_are_made_visible_and_newlines_and_tabs_kept():
    assert visible(f"a{TITLE}b") == "a\\x1b]0;owned\\x07b"
    assert visible(f"x{CSI}y\rz\x00") == "x\\x9b31my\\x0dz\\x00"
    assert visible("line one\n\tline two é ✔") == "line one\n\tline two é ✔"


def _hostile_report() -> Report:
    rec = make_recording(dataset=f"Images{CLEAR}")
    finding = Finding(
        "sample-errors",
        "critical",
        f"dataset[3] raised ValueError: bad{TITLE}",
        {"first_message": f"ValueError: {CLEAR}"},
        f"repair {CSI}it",
        snippet=None,
        settings_change={},
        impact=1.0,
    )
    return Report(f"train.py{TITLE}", {f"val{CLEAR}": LoaderReport(f"val{CLEAR}", rec, [finding], None)})


def test_a_report_with_escape_sequences_prints_them_visibly():
    out = io.StringIO()
    render(_hostile_report(), SafeConsole(file=out, width=100, color_system="truecolor", force_terminal=True))
    text = out.getvalue()
    for raw in ("\x1b]", "\x1b[2J", "\x1b[H", "\x9b", "\x07"):
        assert raw not in text
    assert "\\x1b]0;owned" in text and "\\x1b[2J" in text and "\\x9b31m" in text
    assert "\x1b[1m" in text or "\x1b[" in text.replace("\x1b[2J", "")  # rich's own styles still pass


def test_report_of_a_saved_file_shows_its_escapes_visibly(tmp_path, capsys):
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(_hostile_report().to_dict()))
    assert main(["report", str(saved)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown
    assert "val\\x1b[2J\\x1b[H" in shown
