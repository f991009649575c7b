"""What a tracker logs of a report: the main figures per loader and the findings, read from the report's plain
data, for check, run, tune and scale; names and titles kept as given but bounded, figure keys every tracker
takes."""

from __future__ import annotations

import dataclasses
import re

import pytest
from saved_reports import CHECK, CHECK_TITLE, SCALE, TUNE

from loaderdoctor.integrations.trackers import summarize
from loaderdoctor.integrations.trackers.summary import MAX_KEY_NAME, MAX_NAME, MAX_TITLE
from loaderdoctor.saved import read_report

# MLflow's rule for a metric's or a tag's name, the strictest of the three trackers'.
MLFLOW_KEY = re.compile(r"^[/\w.\- :]*$")


def test_a_check_report_gives_the_rate_wait_limit_and_verified_speedup_and_its_findings():
    summary = summarize(read_report(CHECK))
    assert (summary.kind, summary.target) == ("check", "demo")
    assert summary.figures == {
        "train/batches_per_s": 7.461,
        "train/wait_fraction": 0.8474,  # measured anew from the saved recording (see saved_reports.py)
        "train/share_of_limit": 0.334,
        "train/verified_speedup": 4.295,
    }
    assert summary.findings == [
        {"loader": "train", "rule": "input-bound", "severity": "critical", "title": CHECK_TITLE}
    ]
    assert summary.findings_text() == f"critical input-bound (train): {CHECK_TITLE}"


def test_a_run_report_is_read_as_a_check_and_an_unsteady_speedup_is_left_out():
    report = read_report(CHECK)
    report.command = "run"
    verification = report.loaders["train"].verification
    assert verification is not None and verification.speedup is not None
    report.loaders["train"].verification = dataclasses.replace(verification, unsteady=True)
    summary = summarize(report)
    assert summary.kind == "run"
    assert "train/verified_speedup" not in summary.figures
    assert summary.figures["train/batches_per_s"] == 7.461


def test_a_tune_report_gives_the_users_settings_and_the_chosen_ones_measured_against_them():
    summary = summarize(read_report(TUNE))
    assert summary.kind == "tune" and summary.findings == []
    assert summary.figures == {
        "train/batches_per_s": 2.115,
        "train/share_of_limit": 0.072,
        "train/tuned_batches_per_s": 9.163,
        "train/tuned_share_of_limit": 0.31,
        "train/verified_speedup": 4.333,
    }


def test_a_scale_report_gives_its_largest_rank_count_and_the_rank_that_waited_most():
    summary = summarize(read_report(SCALE))
    assert summary.kind == "scale"
    assert summary.figures == {
        "train/ranks": 2.0,
        "train/samples_per_s": 361.999,
        "train/scaling_efficiency": 3.302,
        "train/wait_fraction": 0.2904,  # rank 0 waited 0.2904, rank 1 0.2858
        "train/share_of_limit": 0.343,
    }
    assert [(f["rule"], f["severity"]) for f in summary.findings] == [
        ("distributed-sampler", "critical"),
        ("input-bound", "critical"),
    ]


@pytest.mark.parametrize(
    "names",
    [
        ["train.py:41", "train.py:41#2", "fit.py:81 rank 1"],
        ["a?b", "a*b", "../x", "/", "", "a//b/./c", "\x1b[31mred\x1b[0m", "é|ü"],
        ["x" * 1000, "x" * 1000 + "y"],
    ],
)
def test_untrusted_loader_names_stay_as_given_in_the_findings_but_bounded_and_keys_are_safe_and_distinct(names):
    report = read_report(CHECK)
    (only,) = report.loaders.values()
    report.loaders = {name: dataclasses.replace(only, name=name) for name in names}
    long_title = "slow " * 200
    for loader in report.loaders.values():
        loader.findings = [dataclasses.replace(loader.findings[0], title=long_title)]
    summary = summarize(report)

    assert [f["loader"] for f in summary.findings] == [
        n if len(n) <= MAX_NAME else n[: MAX_NAME - 1] + "…" for n in names
    ]
    assert all(len(f["title"]) == MAX_TITLE and long_title.startswith(f["title"][:-1]) for f in summary.findings)
    loader_keys = {key.rsplit("/", 1)[0] for key in summary.figures}
    assert len(loader_keys) == len(names)  # one per loader, none merged
    for key in summary.figures:
        assert MLFLOW_KEY.match(key) and len(key) <= MAX_KEY_NAME + 30, key
        assert all(part not in ("", ".", "..") for part in key.split("/")), key
