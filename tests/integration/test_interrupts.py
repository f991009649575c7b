"""Ctrl-C during `loaderdoctor check` and `tune`: every worker ends, what was measured so far is printed, exit
status 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(150)]

_CLI = str(Path(sys.executable).with_name("loaderdoctor"))


def _alive(pids: set[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _interrupted_once_workers_run(command: str) -> tuple[subprocess.CompletedProcess, set[int]]:
    """Run `loaderdoctor COMMAND scenario:demo --json`, press Ctrl-C (SIGINT to the whole process group, workers
    included, as a terminal sends it) a second after its first worker process appears; the result and the pids
    of the processes it had started."""
    run = subprocess.Popen(
        [_CLI, command, "scenario:demo", "--budget", "60", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # As in a terminal: a shell that starts a job in the background without job control leaves SIGINT
        # ignored, and a child inherits that; Ctrl-C must reach the command as it does a user's.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while not seen and time.monotonic() < deadline:
            seen = {child.pid for child in psutil.Process(run.pid).children(recursive=True)}
            time.sleep(0.1)
        assert seen, f"{command} never started a worker"
        time.sleep(1.0)
        seen |= {child.pid for child in psutil.Process(run.pid).children(recursive=True)}
        os.killpg(run.pid, signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    deadline = time.monotonic() + 5
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    return subprocess.CompletedProcess(run.args, run.returncode, out, err), seen


def test_ctrl_c_during_the_fixs_run_prints_the_measurement_and_ends_every_worker():
    # The fix's workers appear once the measurement (without workers) is done.
    done, seen = _interrupted_once_workers_run("check")
    assert done.returncode == 130, done.stderr
    assert "interrupted: what was measured before Ctrl-C" in done.stderr
    (loader,) = json.loads(done.stdout)["loaders"].values()
    assert loader["findings"][0]["rule"] == "input-bound" and loader["verification"] is None
    assert _alive(seen) == []


def test_ctrl_c_during_tune_prints_the_trials_so_far_and_ends_every_worker():
    done, seen = _interrupted_once_workers_run("tune")
    assert done.returncode == 130, done.stderr
    assert "interrupted: the trials measured before Ctrl-C" in done.stderr
    (loader,) = json.loads(done.stdout)["loaders"].values()
    assert loader["stopped"] == "interrupted" and loader["trials"][0]["phase"] == "baseline"
    assert _alive(seen) == []
