"""scale's console report from a hand-made ScaleReport: each rank's rate, wait and share of its limit."""

from __future__ import annotations

import io

from rich.console import Console

from loaderdoctor.render.scale import render
from loaderdoctor.scale.report import RankFigures, ScaleLoaderReport, ScaleReport, ScaleRun


def _text(report: ScaleReport) -> str:
    out = io.StringIO()
    render(report, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_each_rank_states_its_wait_and_its_share_of_its_limit():
    limit = {"batches_per_s": 20.0, "binds": "loading-cpu"}
    one = ScaleRun(1, 320.0, 1.0, 1, [RankFigures(0, 320.0, 0.1, 100, "completed", limit, 0.9)])
    two = ScaleRun(
        2,
        400.0,
        0.62,
        1,
        [
            RankFigures(0, 200.0, 0.45, 100, "completed", limit, 0.55),
            RankFigures(1, 200.0, None, 100, "completed"),  # its limit unknown: no share made up
        ],
    )
    text = _text(ScaleReport("scenario:x", {"train": ScaleLoaderReport("train", [one, two], [])}))
    assert "r0 320.0 (10%; 90% of limit)" in text
    assert "r0 200.0 (45%; 55% of limit)" in text
    assert "r1 200.0" in text and "r1 200.0 (" not in text


def test_a_rank_that_sent_nothing_shows_its_outcome():
    run = ScaleRun(
        2, None, None, 1, [RankFigures(0, None, None, 0, "failed"), RankFigures(1, None, None, 0, "stalled")]
    )
    text = _text(ScaleReport("scenario:x", {"train": ScaleLoaderReport("train", [run], [])}))
    assert "r0 failed" in text and "r1 stalled" in text
