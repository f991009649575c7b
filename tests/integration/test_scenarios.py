"""Every built-in scenario, checked end to end through the command line, each in a fresh process as a user
runs it: the planted cause is the main diagnosis, and the fix is measured."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
from checkout import checkout_env

from loaderdoctor import scenarios

# The checks whose fix is measured (a speedup of 2x or more asserted) run one at a time (`quiet`); the others'
# verdicts hold beside a neighbour, as they must on a shared node, and run two at a time.
pytestmark = [pytest.mark.workers, pytest.mark.timeout(200)]

# Scenarios whose fix is a change of settings, each measured here at 2x or more: the verification must hold.
FIXED_BY_SETTINGS = {"demo", "starved", "respawn", "fork-deadlock", "oversubscribed", "slow-start"}
# Checked with a smaller budget, and more closely, in a file of their own.
CHECKED_APART = {"lock-contention"}  # test_lock_contention.py
# Seconds of checking: workers started again every epoch make respawn's windows long (budget 25 left its fix not
# measured); slow-start's original starts its spawned workers in 6 to 9 s on a slow machine of this kind, twice (the
# check, then the verification), which at 20 s left 1 pair of windows 4 times in 7 (30: 3 in 3 measured, within
# 0.98x to 1.04x a pair); the others verify their fix in 20 s, 3 in 3 there. On that machine, later and slower,
# respawn at 40 s and oversubscribed at 20 s were each left with one pair once: 10 s more for every scenario. On a
# machine where two spawned workers took 5 to 6 s to start each epoch (torch's import alone 2.1 s of CPU), respawn
# was left with one pair at 50 s (CI) and at 70 s once in 2; at 90 s, 3 pairs.
BUDGET_S = {"respawn": 90, "slow-start": 30}
DEFAULT_BUDGET_S = 30


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = checkout_env()
    command = [sys.executable, "-m", "loaderdoctor", "check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)


@functools.cache
def _checked(name: str) -> tuple[int, dict]:
    result = _run(f"scenario:{name}", "--json", "--budget", str(BUDGET_S.get(name, DEFAULT_BUDGET_S)))
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(s.name, marks=[pytest.mark.quiet] if s.name in FIXED_BY_SETTINGS else [])
        for s in scenarios.all_scenarios()
        if s.found_by == "check" and s.name not in CHECKED_APART
    ],
)
def test_the_planted_cause_is_the_main_diagnosis(name):
    status, document = _checked(name)
    (loader,) = document["loaders"].values()
    planted = scenarios.get(name).planted_cause
    serious = [f["rule"] for f in loader["findings"] if f["severity"] != "info"]
    if planted is None:
        assert serious == [], f"a healthy loader got {serious}"
        assert status == 0
        return
    assert loader["findings"][0]["rule"] == planted, serious
    assert status == 1  # every planted cause is critical
    if name in FIXED_BY_SETTINGS:
        verification = loader["verification"]
        assert verification is not None and verification["helped"], verification
        assert verification["after_outcome"] == "completed"


@pytest.mark.quiet
def test_fork_deadlock_is_caught_with_the_stuck_line_and_fixed():
    _, document = _checked("fork-deadlock")
    loader = document["loaders"]["train"]
    by_rule = {f["rule"]: f for f in loader["findings"]}
    assert {"fork-unsafe", "stall"} <= set(by_rule)
    stuck = by_rule["stall"]["evidence"]["stuck_frames"]
    assert stuck and all("fork_deadlock.py:" in frame for frame in stuck)
    assert by_rule["fork-unsafe"]["evidence"]["threads"]
    assert loader["measurements"]["outcome"] == "stalled"
    assert loader["verification"]["settings"]["start_method"] in ("forkserver", "spawn")
    assert loader["verification"]["after"] > 0


def test_the_json_schema_and_no_verification_when_asked():
    result = _run("scenario:bad-samples", "--json", "--no-verify")
    assert result.returncode == 1, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == "loaderdoctor.check/1"
    assert document["target"] == "scenario:bad-samples"
    loader = document["loaders"]["train"]
    assert set(loader) == {"settings", "measurements", "findings", "verification", "epoch", "recording"}
    assert loader["recording"]["settings"] == loader["settings"]  # the run measured, saved to load back
    assert loader["epoch"]["batches"] == loader["measurements"]["batches_per_epoch"]
    assert loader["findings"][0]["rule"] == "sample-errors"
    assert loader["findings"][0]["evidence"]["indices"]
    assert loader["verification"] is None
