"""SIGTERM to `loaderdoctor check`, `tune` and `scale` while workers run ends them as Ctrl-C does: every process
they started ends, what was measured is printed, no temporary folder is left, exit status 143. Each is repeated
with the signal at a different moment after the workers start (check 4 times, tune 3, scale 3), each run with
a TMPDIR of its own."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from sessions import session_processes

pytestmark = [pytest.mark.workers, pytest.mark.timeout(150)]

_CLI = str(Path(sys.executable).with_name("loaderdoctor"))
# Two workers from the first batch on, each sample a few milliseconds: workers run as soon as measuring starts.
SLOW_LOADER = """
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, index):
        time.sleep(0.005)
        return torch.zeros(8)


def loaders():
    return DataLoader(Slow(), batch_size=8, num_workers=2)
"""


def _alive(pids: set[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


@pytest.fixture
def short_folder():
    """A folder of the test's own with a short path, removed after it: the runs' TMPDIR is in it, and
    multiprocessing's sockets live in TMPDIR, their paths 107 bytes at most (pytest's tmp_path under xdist is
    longer than that leaves room for)."""
    folder = Path(tempfile.mkdtemp(prefix="ld-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _terminated(
    tmp_path: Path, argv: list[str], measuring: Callable[[Path], bool], delay_s: float
) -> tuple[subprocess.CompletedProcess, set[int], list[str], Path]:
    """Run `loaderdoctor ARGV` on the slow loader with a TMPDIR of its own, and send it SIGTERM (to its process
    alone, as a scheduler or `kill` does) `delay_s` after `measuring(tmpdir)` says its workers run; the result,
    the pids of the processes it had started then, those of them (or of its session) still alive 5 s after it
    ended (then killed), and its TMPDIR."""
    (tmp_path / "slow_loader.py").write_text(SLOW_LOADER)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    run = subprocess.Popen(
        [_CLI, *argv, "slow_loader.py:loaders", "--no-history"],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmpdir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while not (measuring(tmpdir) and _descendants(run.pid)) and time.monotonic() < deadline:
            assert run.poll() is None, run.stderr.read() if run.stderr else ""
            time.sleep(0.05)
        assert measuring(tmpdir), f"{argv[0]} never started measuring"
        time.sleep(delay_s)
        seen = _descendants(run.pid)
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            out, err = run.communicate()
        deadline = time.monotonic() + 5
        while (_alive(seen) or session_processes(run.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        # Its workers, and scale's agent (a session of its own), its ranks and theirs; any other of its session.
        left = set(_alive(seen)) | set(session_processes(run.pid))
        described = [f"pid {pid}: {_command_line(pid)}" for pid in sorted(left)]
        for pid in left:  # the test's own clean-up, once what was left is noted
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
    return subprocess.CompletedProcess(run.args, run.returncode, out, err), seen, described, tmpdir


def _command_line(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.NoSuchProcess:
        return "(gone)"


def _stacks_folder(tmpdir: Path) -> bool:
    return any(tmpdir.glob("loaderdoctor-stacks-*"))


def _second_trial(tmpdir: Path, first: set[str]) -> bool:
    """Whether tune measures a trial after its baseline: a stacks folder other than the first one it made (kept
    in `first`, on the first call that sees one)."""
    names = {path.name for path in tmpdir.glob("loaderdoctor-stacks-*")}
    if not first:
        first.update(names)
    return bool(names - first)


def _rank_measuring(tmpdir: Path) -> bool:
    return any(tmpdir.rglob("loaderdoctor-stacks-*"))  # a rank's probe session, wherever its TMPDIR is


def _ended_cleanly(done: subprocess.CompletedProcess, left: list[str], tmpdir: Path) -> None:
    assert done.returncode == 143, done.stderr
    assert "stopped by SIGTERM" in done.stderr
    assert "Traceback" not in done.stderr
    assert left == []
    assert sorted(path.name for path in tmpdir.iterdir()) == []


@pytest.mark.parametrize("delay_s", [0.5, 3.0, 6.0])
def test_sigterm_to_check_prints_what_was_measured_and_leaves_nothing(short_folder, delay_s):
    # Input-bound against a 5 ms step: measured for 5 s, then the fix's run (more workers) for the rest.
    argv = ["check", "--budget", "20", "--step-ms", "5", "--json"]
    done, _, left, tmpdir = _terminated(short_folder, argv, _stacks_folder, delay_s)
    _ended_cleanly(done, left, tmpdir)
    assert "stopped by SIGTERM: what was measured before SIGTERM" in done.stderr
    (loader,) = json.loads(done.stdout)["loaders"].values()
    assert loader["recording"]["batches"], "the partial report holds the batches measured"


@pytest.mark.parametrize("delay_s", [0.3, 4.0])
def test_sigterm_to_tune_prints_the_trials_so_far_and_leaves_nothing(short_folder, delay_s):
    first: set[str] = set()
    after_baseline = functools.partial(_second_trial, first=first)  # the trials so far: the baseline at least
    done, _, left, tmpdir = _terminated(short_folder, ["tune", "--budget", "40", "--json"], after_baseline, delay_s)
    _ended_cleanly(done, left, tmpdir)
    assert "stopped by SIGTERM: the trials measured before SIGTERM" in done.stderr
    (loader,) = json.loads(done.stdout)["loaders"].values()
    assert loader["stopped"] == "interrupted" and loader["trials"][0]["phase"] == "baseline"


@pytest.mark.parametrize("delay_s", [0.5, 3.0])
def test_sigterm_to_scale_ends_its_agent_and_ranks_and_leaves_nothing(short_folder, delay_s):
    done, seen, left, tmpdir = _terminated(
        short_folder, ["scale", "--ranks", "1", "--budget", "20"], _rank_measuring, delay_s
    )
    _ended_cleanly(done, left, tmpdir)
    assert len(seen) >= 3, f"the agent, the rank and its workers: {seen}"
