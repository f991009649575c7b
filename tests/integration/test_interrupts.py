"""Ctrl-C during `loaderdoctor check`: every worker ends, what was measured so far is printed, exit status 130."""

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


def test_ctrl_c_during_the_fixs_run_prints_the_measurement_and_ends_every_worker():
    # A new session, so that Ctrl-C can go to the whole process group, workers included, as a terminal sends it.
    check = subprocess.Popen(
        [_CLI, "check", "scenario:demo", "--budget", "60", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while not seen and time.monotonic() < deadline:  # the fix's workers: the measurement is done
            seen = {child.pid for child in psutil.Process(check.pid).children(recursive=True)}
            time.sleep(0.1)
        assert seen, "the check never started the fix's workers"
        time.sleep(1.0)
        os.killpg(check.pid, signal.SIGINT)
        out, err = check.communicate(timeout=60)
    finally:
        if check.poll() is None:
            os.killpg(check.pid, signal.SIGKILL)
            check.wait()
    assert check.returncode == 130, err
    assert "interrupted: what was measured before Ctrl-C" in err
    document = json.loads(out)
    (loader,) = document["loaders"].values()
    assert loader["findings"][0]["rule"] == "input-bound" and loader["verification"] is None
    deadline = time.monotonic() + 5
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(seen) == []
