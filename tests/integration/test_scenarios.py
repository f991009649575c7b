"""Every built-in scenario, checked end to end: the planted cause is the main diagnosis, and the fix is measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loaderdoctor import check, scenarios

pytestmark = [pytest.mark.workers, pytest.mark.timeout(150)]

# Scenarios whose fix is a change of settings, each measured here at 2x or more: the verification must hold.
FIXED_BY_SETTINGS = {"demo", "starved", "respawn", "fork-deadlock", "oversubscribed", "slow-start"}


@pytest.mark.parametrize("name", scenarios.names())
def test_the_planted_cause_is_the_main_diagnosis(name):
    report = check(f"scenario:{name}", budget_s=40)
    (loader,) = report.loaders.values()
    planted = scenarios.get(name).planted_cause
    serious = [f.rule for f in loader.findings if f.severity != "info"]
    if planted is None:
        assert serious == [], f"a healthy loader got {serious}"
        assert report.exit_status == 0
        return
    assert loader.findings[0].rule == planted, [f.rule for f in loader.findings]
    if name in FIXED_BY_SETTINGS:
        verification = loader.verification
        assert verification is not None and verification.helped, verification
        assert verification.after_outcome == "completed"


def test_fork_deadlock_is_caught_with_the_stuck_line_and_fixed():
    report = check("scenario:fork-deadlock", budget_s=40)
    loader = report.loaders["train"]
    by_rule = {f.rule: f for f in loader.findings}
    assert {"fork-unsafe", "stall"} <= set(by_rule)
    stuck = by_rule["stall"].evidence["stuck_frames"]
    assert stuck and all("fork_deadlock.py:" in frame for frame in stuck)
    assert by_rule["fork-unsafe"].evidence["threads"]
    assert loader.recording.outcome == "stalled"
    assert loader.verification.after_outcome == "completed"
    assert len(loader.verification.after_recording.batches) > 0


def test_the_command_line_prints_the_json_schema_and_exits_1_on_a_critical_finding():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-m", "loaderdoctor", "check", "scenario:bad-samples", "--json", "--no-verify"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "loaderdoctor.check/1"
    assert document["target"] == "scenario:bad-samples"
    loader = document["loaders"]["train"]
    assert set(loader) == {"settings", "measurements", "findings", "verification"}
    assert loader["findings"][0]["rule"] == "sample-errors"
    assert loader["findings"][0]["evidence"]["indices"]
    assert loader["verification"] is None
