"""The HTML pages from hand-made reports: self-contained (no script, no address to load), every user string
escaped, the charts drawn from the data (bars, markers, the chosen trial ringed), and a long run kept small."""

from __future__ import annotations

import re

import pytest
from recordings import make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import StackFrame, Stall, WorkerDeath, WorkerStack
from loaderdoctor.render.html import history, scale, svg, timeline, tune
from loaderdoctor.render.kinds import report_page
from loaderdoctor.report import Finding, LoaderReport, Report, Verification
from loaderdoctor.scale.report import RankFigures, ScaleLoaderReport, ScaleReport, ScaleRun
from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.trial import Measurement, Trial

MARKUP = "<b>bold</b><script>alert(1)</script>"
ORIGINAL = Settings(num_workers=0)
FIXED = Settings(num_workers=2, persistent_workers=True)


def _check_report(name: str = "train", **recording) -> Report:
    rec = make_recording(settings=ORIGINAL, epochs=3, batches_per_epoch=30, wait_s=0.05, step_s=0.02, **recording)
    after = make_recording(settings=FIXED, epochs=3, batches_per_epoch=30, wait_s=0.002, step_s=0.02)
    finding = Finding(
        "input-bound",
        "critical",
        "the step waits 71% of the time",
        {"wait_fraction": 0.71},
        "use workers",
        settings_change={"num_workers": 2},
    )
    fix = Verification(FIXED, 14.0, 40.0, "completed", "completed", "faster", "2.9x in 4 pairs", after_recording=after)
    return Report("demo", {name: LoaderReport(name, rec, [finding], fix)})


def _text_of(page: str) -> str:
    """The page's text without its tags (what a reader sees, entities still escaped)."""
    return re.sub(r"<[^>]+>", " ", page)


def test_a_page_is_self_contained_no_script_no_address_to_load():
    page = report_page(_check_report())
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page.lower()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    addresses = set(re.findall(r"(?:https?:)?//[\w.-]+[^\s\"'<>)]*", page))
    assert addresses == {"http://www.w3.org/2000/svg"}  # an SVG namespace names, it loads nothing
    assert "src=" not in page and "@import" not in page and "url(" not in page


def test_every_user_string_is_escaped():
    stall = Stall(
        epoch=2,
        batch=4,
        waited_s=30.0,
        threshold_s=10.0,
        reason=f"no batch for 30 s {MARKUP}",
        stacks=[WorkerStack(123, [StackFrame(f"/data/{MARKUP}.py", 7, "__getitem__")], None)],
    )
    report = _check_report(
        name=f"train{MARKUP}",
        stall=stall,
        outcome="stalled",
        error=f"RuntimeError: {MARKUP}",
        dataset=f"Shards{MARKUP}",
        worker_deaths=[WorkerDeath(1, 3, f"killed {MARKUP}")],
    )
    report.target = f"pkg{MARKUP}:make"
    page = report_page(report)
    assert "<b>" not in page and "<script>" not in page
    escaped = "&lt;b&gt;bold&lt;/b&gt;&lt;script&gt;alert(1)&lt;/script&gt;"
    for where in ("train", "pkg", "Shards", "RuntimeError: ", "/data/", "killed ", "no batch for 30 s "):
        assert where + escaped in page, where


def test_a_check_page_leads_with_the_main_finding_and_the_verified_fix():
    page = report_page(_check_report())
    text = _text_of(page)
    main, fix, timeline = (text.index(words) for words in ("main finding", "verified fix", "Timeline: your settings"))
    assert main < fix < timeline
    assert "14.0 → 40.0 batches/s (2.86x)" in text
    assert "num_workers=2" in text  # the fix's snippet


def test_the_timeline_draws_each_batch_its_wait_over_its_step_and_marks_the_epochs():
    rec = make_recording(settings=ORIGINAL, epochs=3, batches_per_epoch=30, wait_s=0.05, step_s=0.02)
    chart = timeline.timeline(rec, "t")
    assert chart.count('<rect class="wait"') == 90  # one per batch
    assert chart.count('<rect class="step"') == 90
    assert chart.count('class="mark"') == 3  # epochs 0, 1 and 2
    assert "epoch 1, batch 0: wait 50.0 ms, step 20.0 ms" in chart


def test_a_stall_and_a_dead_worker_are_marked_on_the_timeline():
    stall = Stall(epoch=1, batch=5, waited_s=30.0, threshold_s=10.0, reason="no batch")
    rec = make_recording(
        settings=FIXED, epochs=2, batches_per_epoch=10, stall=stall, worker_deaths=[WorkerDeath(0, 4, "SIGKILL")]
    )
    chart = timeline.timeline(rec, "t")
    assert 'class="stall"' in chart and "batch 5 of epoch 1 never came" in chart
    assert 'class="died"' in chart and "worker died: SIGKILL" in chart


def test_a_long_run_is_drawn_in_groups_and_its_page_stays_small():
    rec = make_recording(settings=FIXED, epochs=4, batches_per_epoch=20_000, wait_s=0.004, step_s=0.02)
    report = Report("big", {"train": LoaderReport("train", rec, [])})
    page = report_page(report)
    chart = timeline.timeline(rec, "t")
    assert chart.count("<g><title>") <= timeline.MAX_BARS + 4  # grouped, never one bar per batch of 80,000
    assert "(mean of" in chart
    assert len(page.encode()) < 5 * 2**20


def test_nice_ticks_are_round_and_cover_the_range():
    assert svg.nice_ticks(0, 47.3) == [0, 10, 20, 30, 40, 50]
    assert svg.nice_ticks(0, 1.0) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    ticks = svg.nice_ticks(0, 1234)
    assert ticks[0] == 0 and ticks[-1] >= 1234 and len(ticks) <= 7
    assert svg.nice_ticks(5, 5) == [5, 5.2, 5.4, 5.6, 5.8, 6.0]  # no range: one unit above


def _tune_report() -> TuneReport:
    def trial(number, settings, phase, rate, mb, verdict="measured"):
        run = Measurement(rate, "completed" if verdict == "measured" else verdict, 2.0, memory_bytes=int(mb * 2**20))
        return Trial(number, settings, phase, verdict, [run])

    baseline = trial(1, ORIGINAL, "baseline", 14.0, 300)
    trials = [
        baseline,
        trial(2, Settings(num_workers=1), "workers", 24.0, 500),
        trial(3, FIXED, "workers", 39.0, 700),
        trial(4, Settings(num_workers=2, backend="thread"), "threads", 20.0, 350),
        trial(5, Settings(num_workers=4), "workers", 0.0, 900, verdict="stalled"),
    ]
    limits = Limits(2.0, 8 * 2**30, None, 8, "fork", False, False)
    tuning = LoaderTuning(f"train{MARKUP}", trials, baseline, trials[2], limits, 30.0, "converged", 20.0)
    return TuneReport("demo", {"train": tuning})


def test_a_tune_page_plots_every_trial_by_workers_and_backend_and_rings_the_choice():
    page = tune.page(_tune_report())
    text = _text_of(page)
    assert "2.79x the baseline" in text
    assert 'class="highlight"' in page and "chosen #3" in page
    assert "threads" in text and "main process" in text and "worker processes" in text  # by backend
    assert page.count("<circle") >= 2 * 5  # each trial a point on the rate and the memory chart
    assert "&lt;b&gt;" in page and "<b>" not in page


def test_a_scale_page_draws_rate_efficiency_and_each_ranks_wait():
    one = ScaleRun(1, 320.0, 1.0, 1, [RankFigures(0, 320.0, 0.1, 100, "completed")])
    two = ScaleRun(
        2, 400.0, 0.62, 1, [RankFigures(0, 200.0, 0.45, 100, "completed"), RankFigures(1, 200.0, 0.8, 100, "completed")]
    )
    failed = ScaleRun(4, None, None, 1, [RankFigures(0, None, None, 0, "failed")], failures=[f"rank 3 hung {MARKUP}"])
    report = ScaleReport("scenario:lock", {"train": ScaleLoaderReport("train", [one, two, failed], [])})
    page = scale.page(report)
    assert page.count('<svg class="chart"') == 3
    assert "perfect scaling" in page and "efficiency 0.62" in page
    assert "2 ranks, rank 1: waiting on data 80% of the time" in page
    assert "rank 3 hung &lt;b&gt;" in page


def _run(run_id: int, rate: float, started: str, findings=()) -> dict:
    return {
        "id": run_id,
        "name": "demo/train",
        "kind": "check",
        "started_at": started,
        "ended_at": started,
        "host": {"hostname": MARKUP},
        "settings": FIXED.to_dict(),
        "target": "demo",
        "measurements": {"batches_per_s": rate, "wait_fraction": 0.1},
        "findings": list(findings),
        "dataset": {},
    }


def test_a_history_page_shows_the_trend_of_its_name_with_this_run_ringed():
    runs = [_run(n, rate, f"2026-11-2{n}T10:00:00+00:00") for n, rate in ((1, 40.0), (2, 39.0), (3, 2.0))]
    finding = {"rule": "run-degradation", "severity": "critical", "title": "20x slower", "evidence": {}, "fix": "x"}
    runs[2]["findings"] = [finding]
    page = history.page(runs[2], runs)
    assert "run 3 (check" in page and "2.0 batches/s" in page
    assert '<g class="highlight">' in page and ">run 3<" in page
    assert "run-degradation" in _text_of(page)
    assert "&lt;b&gt;" in page and "<b>" not in page


@pytest.mark.parametrize("build", [_check_report, _tune_report])
def test_dark_mode_and_print_are_styled(build):
    page = report_page(build())
    assert "@media (prefers-color-scheme: dark)" in page and "@media print" in page


def test_workers_started_again_each_epoch_are_marked_as_restarts():
    rec = make_recording(settings=Settings(num_workers=2), epochs=3, batches_per_epoch=10)  # not persistent
    chart = timeline.timeline(rec, "t")
    assert chart.count('class="restart"') == 2  # epochs 1 and 2; epoch 0's start is the run's own
    assert "epoch 2: workers started" in chart
    persistent = timeline.timeline(make_recording(settings=FIXED, epochs=3, batches_per_epoch=10), "t")
    assert 'class="restart"' not in persistent


def test_a_jobs_findings_across_its_ranks_open_the_page_once():
    straggler = Finding(
        "rank-straggler",
        "critical",
        "ranks 2, 3 on node1 wait 90 ms per batch for data",
        {"rank": 3, "ranks": [2, 3]},
        "Make their loading as fast as the others'.",
        impact=0.9,
    )
    loaders = {
        f"train.py:15/rank{rank}": LoaderReport(f"train.py:15/rank{rank}", make_recording(), findings, None)
        for rank, findings in [(0, []), (1, [straggler])]
    }
    page = report_page(Report("train.py", loaders, "run"))
    job = page.index("the job: loader &#x27;train.py:15&#x27; across its ranks")
    assert job < page.index("ranks 2, 3 on node1 wait 90 ms") < page.index("loader &#x27;train.py:15/rank0&#x27;")
    assert page.count("ranks 2, 3 on node1 wait 90 ms") == 1
