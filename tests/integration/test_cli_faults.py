"""The `loaderdoctor` command under smaller faults (issue 33.13): a target that closes standard output, Ctrl-C while
the command is still starting, and its warnings shown as one visible line each, never in Python's warning format."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(240)]

_CLI = str(Path(sys.executable).with_name("loaderdoctor"))
CLEAR = "\x1b[2J"  # clears the screen

CLOSES_STDOUT = """\
import os

import torch
from torch.utils.data import DataLoader, Dataset


class ClosesStdout(Dataset):
    def __init__(self):
        os.close(1)

    def __len__(self):
        return 32

    def __getitem__(self, index):
        return torch.tensor([float(index)])


def make_loader():
    return DataLoader(ClosesStdout(), batch_size=4)
"""

TINY = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_loader():
    return DataLoader(TensorDataset(torch.arange(32.0).view(16, 2)), batch_size=4)
"""


def _run(argv: list[str], home: Path, **options: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOADERDOCTOR_HOME": str(home)}
    return subprocess.run([_CLI, *argv], capture_output=True, text=True, env=env, timeout=120, **options)


def test_a_dataset_that_closes_stdout_is_a_clear_error_not_a_traceback(tmp_path):
    target = tmp_path / "closes_stdout.py"
    target.write_text(CLOSES_STDOUT)
    done = _run(["check", f"{target}:make_loader", "--budget", "3", "--epochs", "1", "--no-verify"], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "error: cannot write to standard output: [Errno 9] Bad file descriptor" in done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_history_warnings_are_one_line_each_with_control_characters_made_visible(tmp_path):
    """A run that cannot be saved (the history's folder is under a file) and a history row that cannot be read:
    each is one `loaderdoctor: WARNING:` line, without Python's file:line and source line, its escape visible."""
    blocker = tmp_path / f"file{CLEAR}"
    blocker.write_text("a file where the history's folder would be")
    target = tmp_path / "tiny_warned.py"
    target.write_text(TINY)
    done = _run(["check", f"{target}:make_loader", "--budget", "2", "--epochs", "1", "--no-verify"], blocker / "sub")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "did not save" in line]
    assert line.startswith("loaderdoctor: WARNING: loaderdoctor did not save the check run"), line
    assert "is a file, not a folder" in line and "file\\x1b[2J" in line
    assert "\x1b" not in done.stderr and "HistoryWarning" not in done.stderr
    assert not re.search(r"\.py:\d+: ", done.stderr)  # Python's format: path:line: Category: ...

    home = tmp_path / f"home{CLEAR}"
    checked = _run(["check", f"{target}:make_loader", "--budget", "2", "--epochs", "1", "--no-verify"], home)
    assert checked.returncode == 0, checked.stderr
    db = sqlite3.connect(home / "history.sqlite3")
    with db:  # a row of a wrong type: skipped with a warning
        rest = json.dumps({"host": {}, "settings": {}, "measurements": "fast", "findings": []})
        moments = ("2026-01-01T00:00:00", "2026-01-01T00:01:00")
        db.execute("INSERT INTO runs VALUES (2, 'x', 'watch', ?, ?, ?)", (*moments, rest))
    db.close()
    listed = _run(["history"], home)
    assert listed.returncode == 0, listed.stderr
    (line,) = [line for line in listed.stderr.splitlines() if "cannot be read" in line]
    assert line.startswith("loaderdoctor: WARNING: run 2 in the history at ") and "home\\x1b[2J" in line
    assert "\x1b" not in listed.stderr


# SIGINT this long after torch's libraries begin to load in the command (about 2 s of imports on an idle 2-core
# machine follow), then as the command begins. Counted from there, not from the process's start: before
# loaderdoctor's first line runs (Python's own start, site), no program can handle Ctrl-C, and a loaded machine
# makes that window long.
_CTRL_C_AFTER_S = (0.0, 0.1, 0.35, 0.75, 1.5, 3.0)


def _wait_for_torch_to_load(pid: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "/torch/lib/" in Path(f"/proc/{pid}/maps").read_text():
            return
        time.sleep(0.005)
    raise AssertionError("the command never began to import torch")


def test_ctrl_c_at_any_early_moment_of_tune_ends_it_as_interrupted_without_a_traceback():
    outcomes = []
    for delay in _CTRL_C_AFTER_S:
        run = subprocess.Popen(
            [_CLI, "tune", "scenario:demo", "--budget", "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
        )
        try:
            _wait_for_torch_to_load(run.pid)
            time.sleep(delay)
            os.killpg(run.pid, signal.SIGINT)  # as Ctrl-C: the whole group
            _, err = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        outcomes.append((delay, run.returncode, err))
    for delay, status, err in outcomes:
        assert status == 130 and "Traceback" not in err and "interrupted" in err, (delay, status, err[-2000:])
