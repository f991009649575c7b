"""Reports of real runs of check, tune, scale (a saved one: a launch of ranks takes half a minute, and
test_scale_ranks.py runs scale for real) and `report latest`, written with --html and opened in headless Chromium:
their charts are drawn, nothing errs, nothing is asked of the network, and a loader named with markup shows that
markup as text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from chromium import PageResult, open_page

import loaderdoctor

MARKUP_NAME = "train<b>bold</b><img src=x>"
PIPELINE = """
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        time.sleep(0.004)
        return torch.zeros(8)


def make():
    return {NAME_LITERAL: DataLoader(Slow(), batch_size=4)}
"""


def _loaderdoctor(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    # This checkout's loaderdoctor, and nothing else of this process's sys.path: a test that ran before in this
    # process may have put a folder of its own there (a target's), whose pipeline.py would take the name of ours.
    source = str(Path(loaderdoctor.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": source}
    command = [sys.executable, "-m", "loaderdoctor", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    assert result.returncode in (0, 1), result.stderr
    return result


def _opened(path: Path, chromium: str, **options) -> PageResult:
    assert path.is_file() and path.stat().st_size < 5 * 2**20
    page = open_page(path, binary=chromium, **options)
    assert page.errors == [], page.errors
    assert page.outside_requests == [], page.outside_requests
    return page


@pytest.mark.timeout(300)
def test_a_check_and_the_latest_history_run_render_with_their_charts(tmp_path, chromium):
    target = tmp_path / "pipeline.py"
    target.write_text(PIPELINE.replace("NAME_LITERAL", repr(MARKUP_NAME)))
    page_path = tmp_path / "check.html"
    _loaderdoctor("check", f"{target}:make", "--budget", "6", "--step-ms", "5", "--html", str(page_path))
    expressions = {
        "markup_elements": "document.querySelectorAll('section b, section img').length",
        "headings": "[...document.querySelectorAll('h2')].map(h => h.textContent)",
    }
    page = _opened(page_path, chromium, expressions=expressions)
    assert page.svg_count >= 4  # the timelines (the user's settings and the fix), the rate per epoch, memory
    assert f"loader '{MARKUP_NAME}'" in page.values["headings"]
    assert page.values["markup_elements"] == 0  # the name's tags are text, not elements
    assert "verified fix" in page.text and "Timeline: the fix" in page.text

    history_path = tmp_path / "latest.html"
    _loaderdoctor("report", "latest", "--html", str(history_path))
    latest = _opened(history_path, chromium, expressions={"markup_elements": "document.querySelectorAll('b').length"})
    assert latest.svg_count >= 1 and "Rate of each run" in latest.text
    assert MARKUP_NAME in latest.text and latest.values["markup_elements"] == 0


@pytest.mark.timeout(300)
def test_a_tune_page_renders_its_trials(tmp_path, chromium):
    page_path = tmp_path / "tune.html"
    _loaderdoctor("tune", "demo", "--budget", "8", "--quick", "--max-workers", "2", "--html", str(page_path))
    page = _opened(page_path, chromium)
    assert page.svg_count >= 2 and "Rate of each trial" in page.text and "baseline" in page.text


@pytest.mark.timeout(300)
def test_a_scale_page_renders_rate_efficiency_and_waits(tmp_path, chromium):
    page_path = tmp_path / "scale.html"
    saved = Path(__file__).resolve().parents[1] / "unit" / "saved" / "scale-a0702f8.json"  # scale demo --ranks 1,2
    _loaderdoctor("report", str(saved), "--html", str(page_path))
    page = _opened(page_path, chromium)
    assert page.svg_count >= 3 and "Efficiency" in page.text and "r1 of 2" in page.text


@pytest.mark.timeout(120)
def test_dark_mode_and_print_render_too(tmp_path, chromium):
    from loaderdoctor.render.kinds import report_page

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "render"))
    from test_html import _check_report

    path = tmp_path / "report.html"
    path.write_text(report_page(_check_report()))
    background = "getComputedStyle(document.body).backgroundColor"
    dark = _opened(path, chromium, color_scheme="dark", expressions={"background": background})
    light = _opened(path, chromium, color_scheme="light", media="print", expressions={"background": background})
    assert dark.values["background"] == "rgb(20, 23, 28)" and light.values["background"] == "rgb(255, 255, 255)"
    assert dark.svg_count == light.svg_count >= 4
