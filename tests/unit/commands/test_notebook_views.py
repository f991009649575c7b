"""A report in a notebook, without a kernel: `_repr_html_` is its page in a sandboxed iframe (a hostile name inert),
`str()` its console text; the progress line (a notebook's display updated in place, or a terminal's), and
StoppedByUser's `report`."""

from __future__ import annotations

import io
import pickle
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import pytest
from recordings import make_recording
from rich.console import Console

import loaderdoctor
from loaderdoctor.commands import public
from loaderdoctor.errors import StoppedByUser
from loaderdoctor.probe.measuring import ProbeProgress
from loaderdoctor.render import progress
from loaderdoctor.report import Finding, LoaderReport, Report
from loaderdoctor.saved import read_report
from loaderdoctor.scale.report import ScaleReport
from loaderdoctor.tune.result import TuneReport

SAVED = Path(__file__).parents[1] / "saved"
HOSTILE = "<script>alert(1)</script>\x1b[2J"
TITLE = "The training step waits for data 63% of the time"


def _report(name: str = HOSTILE) -> Report:
    finding = Finding(
        "input-bound", "critical", TITLE, {"wait_fraction": 0.63}, "use 2 workers", snippet=None,
        settings_change={"num_workers": 2}, impact=0.63,
    )  # fmt: skip
    return Report("train.py", {name: LoaderReport(name, make_recording(), [finding], None)})


class _Page(HTMLParser):
    """The tags, iframes' attributes and text of an HTML fragment."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.frames: list[dict[str, str | None]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "iframe":
            self.frames.append(dict(attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_a_reports_html_is_its_page_in_a_sandboxed_frame_and_a_hostile_name_stays_text():
    html = _report()._repr_html_()
    assert "<script" not in html.lower()  # the page is escaped into the attribute: no markup of it reaches the host
    host = _Page(html)
    assert host.tags == ["iframe"]
    (frame,) = host.frames
    assert frame["sandbox"] == ""  # no permission at all: no script, no same origin
    page = frame["srcdoc"] or ""
    assert page.startswith("<!DOCTYPE html>") and "default-src 'none'" in page  # the page's own CSP holds
    inner = _Page(page)
    assert "script" not in inner.tags and "iframe" not in inner.tags
    text = "".join(inner.text)
    assert "<script>alert(1)</script>" in text and TITLE in text  # the name shown as text, the finding's title


def test_tune_and_scale_reports_show_inline_too():
    for saved, kind in (("tune-a0702f8.json", TuneReport), ("scale-a0702f8.json", ScaleReport)):
        report = read_report(SAVED / saved)
        assert isinstance(report, kind)
        (frame,) = _Page(report._repr_html_()).frames
        assert frame["sandbox"] == "" and "train" in "".join(_Page(frame["srcdoc"] or "").text)
        assert "loader 'train'" in str(report)


def test_str_is_the_console_text_as_show_prints_it_with_control_characters_visible():
    report = _report("val\x1b[2J")
    shown = io.StringIO()
    loaderdoctor.show(report, file=shown)
    text = str(report)
    assert text == "\n".join(line.rstrip() for line in shown.getvalue().splitlines()) + "\n"
    assert "loaderdoctor check train.py" in text and "critical input-bound" in text
    assert "\x1b" not in text and "val\\x1b[2J" in text
    assert repr(report).startswith("<loaderdoctor check of 'train.py'")  # repr stays the short one


def test_a_stop_holds_its_partial_report_as_report_and_says_what_was_stopped():
    report = _report("train")
    stop = StoppedByUser(report)
    assert stop.report is report and stop.partial is report and isinstance(stop, KeyboardInterrupt)
    assert loaderdoctor.StoppedByUser is StoppedByUser  # public: `except loaderdoctor.StoppedByUser as e`
    words = str(stop)
    assert words.startswith("check of 'train.py' stopped before the end ('train' measured)")
    assert "`report`" in words and "loaderdoctor.show(e.report)" in words
    assert pickle.loads(pickle.dumps(stop)).report.target == "train.py"
    assert str(StoppedByUser(Report("t.py", {}, command="run"))).startswith("run of 't.py' stopped before the end")
    one = str(StoppedByUser(report.loaders["train"]))
    assert one.startswith("check of one loader of 'train' stopped") and "show" not in one  # show() takes no part
    assert str(StoppedByUser()) == "stopped before anything was measured"


@pytest.fixture
def notebook(monkeypatch):
    """A Jupyter kernel as far as the progress display can tell, its display calls kept: each display's bundles
    (the first shown, the others its updates)."""
    displays: list[list[dict[str, str]]] = []

    class Handle:
        def __init__(self, bundle: dict[str, str]) -> None:
            self.bundles = [bundle]
            displays.append(self.bundles)

        def update(self, bundle: dict[str, str], raw: bool) -> None:
            assert raw
            self.bundles.append(bundle)

    def display(bundle: dict[str, str], raw: bool, display_id: bool) -> Handle:
        assert raw and display_id
        return Handle(bundle)

    monkeypatch.setattr(progress, "in_jupyter", lambda: True)
    monkeypatch.setattr("IPython.display.display", display)
    return displays


FIGURES = ProbeProgress(epoch=0, epochs=3, batches=5, elapsed_s=0.5, budget_s=2.0)


def test_check_in_a_notebook_updates_one_display_with_the_phase_and_the_time_left(notebook, monkeypatch):
    def measured(target, *, progress, **options):
        progress("val\x1b[2J<b>", "measure", FIGURES)
        return _report("train")

    monkeypatch.setattr(public, "_check", measured)
    report = loaderdoctor.check("train.py:make", budget_s=3)
    assert report.target == "train.py"
    (bundles,) = notebook  # one display, updated in place
    lines = [bundle["text/plain"] for bundle in bundles]
    assert lines[0] == "loaderdoctor check: starting"
    assert (
        lines[1] == "loaderdoctor check: measuring 'val\\x1b[2J<b>': epoch 1/3, 5 batches; ~3 s left of the 3 s budget"
    )
    assert "&lt;b&gt;" in bundles[1]["text/html"] and "<b>" not in bundles[1]["text/html"]
    assert lines[-1].startswith("loaderdoctor check: done in") and lines[-1].endswith(
        "; last: measuring 'val\\x1b[2J<b>': epoch 1/3, 5 batches"
    )


def test_a_stopped_tune_in_a_notebook_says_so_and_a_callers_own_progress_replaces_the_display(notebook, monkeypatch):
    def stopped(target, *, progress, **options):
        progress("train", "4 workers", FIGURES)
        raise StoppedByUser(TuneReport("train.py", {}))

    monkeypatch.setattr(public, "_tune", stopped)
    with pytest.raises(StoppedByUser) as stop:
        loaderdoctor.tune("train.py:make", budget_s=10)
    assert stop.value.report.target == "train.py"
    (bundles,) = notebook
    assert "tuning 'train': 4 workers: 5 batches; ~10 s left of the 10 s budget" in bundles[1]["text/plain"]
    assert bundles[-1]["text/plain"].startswith("loaderdoctor tune: stopped after")
    own: list[str] = []
    monkeypatch.setattr(public, "_tune", lambda target, *, progress, **options: progress("train", "2 workers", FIGURES))
    loaderdoctor.tune("train.py:make", progress=lambda name, settings, figures: own.append(settings))
    assert own == ["2 workers"] and len(notebook) == 1  # no display of ours beside the caller's


def test_scale_counts_its_budget_per_launch(notebook, monkeypatch):
    monkeypatch.setattr(public, "_scale", lambda target, *, progress, **options: progress("measuring under 2 ranks"))
    loaderdoctor.scale("train.py:make", ranks=[1, 2], budget_s=5)
    assert "measuring under 2 ranks; ~10 s left of the 10 s budget" in notebook[0][1]["text/plain"]


def test_a_terminal_shows_the_line_as_text_never_markup():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with progress.LiveProgress(console, budget_s=60) as live:
        live.check_update("[bold]train[/bold]", "verify", FIGURES)
    shown = out.getvalue()
    assert "verifying the fix for '[bold]train[/bold]': epoch 1/3, 5 batches; ~60 s left of the 60 s budget" in shown


def test_a_jupyter_kernel_is_told_by_its_shell(monkeypatch):
    assert not progress.in_jupyter()  # pytest is no kernel
    shell = type("ZMQInteractiveShell", (), {})()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert progress.in_jupyter()
    colab = type("Shell", (type(shell),), {})()  # Colab's shell: a ZMQInteractiveShell by another name
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: colab))
    assert progress.in_jupyter()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert not progress.in_jupyter()


def test_the_command_line_shows_the_time_left_of_its_budget(monkeypatch, capsys):
    from loaderdoctor.cli import main
    from loaderdoctor.commands import check as check_command
    from loaderdoctor.commands import running

    def measured(target, *, progress, **options):
        progress("train", "measure", FIGURES)
        return _report("train")

    shown = io.StringIO()  # stderr as a terminal would get it
    monkeypatch.setattr(check_command, "check", measured)
    monkeypatch.setattr(
        running,
        "LiveProgress",
        lambda err, budget_s: progress.LiveProgress(Console(file=shown, force_terminal=True, width=200), budget_s),
    )
    assert main(["check", "train.py:make", "--budget", "7", "--no-history"]) == 1  # the report's critical finding
    assert "measuring 'train': epoch 1/3, 5 batches; ~7 s left of the 7 s budget" in shown.getvalue()
    assert "critical input-bound" in capsys.readouterr().out
