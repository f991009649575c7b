"""`loaderdoctor run --nproc-per-node 2` ended by SIGTERM (a scheduler's, to the loaderdoctor process alone) or
Ctrl-C (SIGINT to its process group, as a terminal sends it) ends as one `python train.py` run ends (issue 33.6):
130 or 143, every rank's summary, kept in the history, no traceback of loaderdoctor's, no process left; a rank
that fails to start ends the launch as cleanly (issue 33.7). Two gloo ranks on CPU, each with a worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sessions import kill_session, session_processes

from loaderdoctor.history.store import load_runs

pytestmark = [pytest.mark.workers, pytest.mark.timeout(180)]

# Each rank writes its pid (its session's id: the launcher starts each rank in a session of its own) once its
# loader has delivered 20 batches, then trains until it is ended.
FOREVER = """\
import os, pathlib, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

dist.init_process_group("gloo")
rank = dist.get_rank()
loader = DataLoader(torch.arange(10_000), batch_size=4, num_workers=1, persistent_workers=True)
grad = torch.zeros(10)
while True:
    for number, batch in enumerate(loader):
        time.sleep(0.005)
        dist.all_reduce(grad)
        if number == 20:
            pathlib.Path(f"started{rank}").write_text(str(os.getpid()))
"""
SITE = "forever.py:8"
# A try: its ranks' start (two interpreters importing torch) on a loaded machine, then its end.
START_S = 90
END_S = 60
# Frames of loaderdoctor's launching process: a traceback of its own, not a rank script's.
OWN_FRAMES = ("loaderdoctor/cli.py", "loaderdoctor/commands/run.py", "loaderdoctor/job/ranks.py")


def _wait_for(paths: list[Path], process: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if all(path.exists() and path.read_text() for path in paths):
            return True
        time.sleep(0.05)
    return False


def _sessions_left(sessions: list[int], wait_s: float = 5.0) -> dict[int, str]:
    """What is left of `sessions` once `wait_s` has passed (processes being reaped vanish meanwhile)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = {pid: line for sid in sessions for pid, line in session_processes(sid).items()}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.parametrize("attempt", range(2))  # 2 tries of each signal here; 12 were run while it was written
@pytest.mark.parametrize(("signum", "said"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_ranks_ended_by_a_signal_leave_each_ranks_summary_in_the_history_and_no_process(
    tmp_path, signum, said, attempt
):
    (tmp_path / "forever.py").write_text(textwrap.dedent(FOREVER))
    process = subprocess.Popen(
        [sys.executable, "-m", "loaderdoctor", "run", "--nproc-per-node", "2", "--json", "out.json", "forever.py"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack (a hang below)
        # As in a terminal: a shell without job control may leave SIGINT ignored, and python would ignore Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    started = [tmp_path / f"started{rank}" for rank in (0, 1)]
    sessions = [process.pid]
    try:
        assert _wait_for(started, process, START_S), process.communicate(timeout=30)
        sessions += [int(path.read_text()) for path in started]
        if signum == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: to the terminal's foreground process group
        else:
            process.send_signal(signal.SIGTERM)  # a scheduler's kill: the loaderdoctor process alone
        try:
            _, stderr = process.communicate(timeout=END_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stderr = process.communicate(timeout=30)
            pytest.fail(f"run did not end within {END_S} s of {said}; its threads when aborted:\n{stderr[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        left = _sessions_left(sessions)
        for sid in sessions:
            kill_session(sid)
    assert left == {}, left  # the ranks and their workers ended too
    assert process.returncode == 128 + signum, stderr
    assert f"the script was ended by {said}" in " ".join(stderr.split()), stderr
    assert "SignalException" not in stderr and not [frame for frame in OWN_FRAMES if frame in stderr], stderr
    assert "RuntimeWarning" not in stderr, stderr  # each rank said "'loaderdoctor.watch.ranks' found in sys.modules"
    loaders = json.loads((tmp_path / "out.json").read_text())["loaders"]
    assert sorted(loaders) == [f"{SITE}/rank0", f"{SITE}/rank1"]
    assert all(loader["measurements"]["batches"] >= 21 for loader in loaders.values())
    assert sorted(run.name for run in load_runs()) == [f"{SITE}/rank0", f"{SITE}/rank1"]


# A rank that trains without waiting for the others (the other will never start).
ALONE = """\
import time
import torch
from torch.utils.data import DataLoader

loader = DataLoader(torch.arange(10_000), batch_size=4, num_workers=1, persistent_workers=True)
while True:
    for batch in loader:
        time.sleep(0.005)
"""
# The launcher's second rank cannot be started (as fork fails with EAGAIN when the processes allowed are used up):
# the first, already started, is what the launch must end.
FAILING_START = """\
import errno, sys
import torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler as handler

real = handler.Popen

def popen(*args, **kwargs):
    if not popen.started:
        process = real(*args, **kwargs)
        popen.started = process.pid
        with open("started_rank", "w") as out:
            out.write(str(process.pid))
        return process
    raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

popen.started = None
handler.Popen = popen
from loaderdoctor.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_rank_that_cannot_be_started_ends_the_launch_cleanly(tmp_path):
    (tmp_path / "forever.py").write_text(textwrap.dedent(ALONE))
    (tmp_path / "failing_start.py").write_text(FAILING_START)
    process = subprocess.Popen(
        [sys.executable, "failing_start.py", "run", "--nproc-per-node", "2", "forever.py"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _, stderr = process.communicate(timeout=END_S + START_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        rank = int((tmp_path / "started_rank").read_text())
        left = _sessions_left([process.pid, rank])
        kill_session(rank)
    assert left == {}, left  # the rank started before the failure ended with the launch
    assert process.returncode == 1, stderr
    said = " ".join(stderr.split())
    assert "ended by a failure to start the ranks (BlockingIOError: [Errno 11] Resource temporarily unavailable)" in (
        said
    ), stderr
    assert "rank 1 could not be watched: it sent nothing of what it measured" in said, stderr
    assert "Traceback" not in stderr, stderr
