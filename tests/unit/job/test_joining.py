"""A `loaderdoctor run` job's mark and its reading, without starting a process: the variables are in force only
inside the block; the startup hook arms nothing for a folder that is not the job's or not private, and runs the
sitecustomize it hid; processes that registered but wrote nothing are named, with why."""

from __future__ import annotations

import json
import os
import sys

import pytest

from loaderdoctor.job import hook as jobhook
from loaderdoctor.job import joining as job
from loaderdoctor.job.joining import JobRun, _joined, _marked
from loaderdoctor.job.script import ScriptRun
from loaderdoctor.report import UnwatchedProcess

NO_SUCH_PID = 2**22 + 17  # above Linux's largest pid


@pytest.mark.parametrize("before", [None, "/theirs"])
def test_the_jobs_variables_are_in_force_only_inside_the_block(tmp_path, monkeypatch, before):
    if before is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", before)
    monkeypatch.delenv(jobhook.JOB_ENV, raising=False)
    with _marked(tmp_path, guarded=True, name="job"):
        assert os.environ[jobhook.JOB_ENV] == str(tmp_path)
        assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), *([before] if before else [])]
        assert os.environ["LOADERDOCTOR_RUN_GUARD"] == "1" and os.environ["LOADERDOCTOR_RUN_NAME"] == "job"
    assert os.environ.get("PYTHONPATH") == before
    assert jobhook.JOB_ENV not in os.environ and "LOADERDOCTOR_RUN_NAME" not in os.environ


def _register(folder, pid: int, **fields) -> None:
    (folder / jobhook.PROCESS_FILE.format(pid=pid)).write_text(json.dumps({"pid": pid, "argv": "python x.py",
                                                                            **fields}))  # fmt: skip


def test_processes_that_registered_but_wrote_nothing_are_named_with_why(tmp_path):
    _register(tmp_path, NO_SUCH_PID, rank=1)
    _register(tmp_path, NO_SUCH_PID - 1, rank=None, error="ImportError: no torch here")
    result = _joined(ScriptRun(0), tmp_path, None, grace_s=5)

    assert isinstance(result, JobRun) and result.loaders == [] and result.exit_status == 0
    assert [u.words() for u in result.unwatched] == [
        f"rank 1 (pid {NO_SUCH_PID}) could not be watched: it ended before writing what it measured (killed, "
        "os._exit, or a crash)",
        f"process {NO_SUCH_PID - 1} (python x.py) could not be watched: ImportError: no torch here",
    ]


def test_a_registered_process_that_still_runs_is_waited_for_then_named(tmp_path):
    _register(tmp_path, os.getpid(), rank=0)  # this very process: it runs on, and never writes
    result = _joined(ScriptRun(0), tmp_path, None, grace_s=0.2)
    assert [u.words() for u in result.unwatched] == [
        f"rank 0 (pid {os.getpid()}) could not be watched: it still ran 0.2 s after the script ended"
    ]


def test_a_job_nobody_registered_with_is_the_scripts_run_as_it_was(tmp_path):
    run = ScriptRun(3, [], "an exception")
    result = _joined(run, tmp_path, 0, grace_s=5)
    assert (result.exit_status, result.loaders, result.ended_by, result.unwatched) == (3, [], "an exception", [])


def test_the_rank_words():
    assert UnwatchedProcess(7, 2, "why").words() == "rank 2 (pid 7) could not be watched: why"
    assert (
        UnwatchedProcess(7, None, "why", "python a.py").words() == "process 7 (python a.py) could not be watched: why"
    )


@pytest.fixture
def hidden_sitecustomize(tmp_path, monkeypatch):
    """A job folder first on sys.path and, after it, a folder with a sitecustomize of the user's."""
    here, theirs = tmp_path / "job", tmp_path / "theirs"
    here.mkdir(mode=0o700)
    theirs.mkdir()
    monkeypatch.setattr(sys, "path", [str(here), str(theirs), *sys.path])
    monkeypatch.delitem(sys.modules, "sitecustomize", raising=False)
    return here, theirs


def test_the_sitecustomize_the_job_hid_runs_after_the_hook(hidden_sitecustomize, monkeypatch):
    here, theirs = hidden_sitecustomize
    (here / "sitecustomize.py").write_text("raise AssertionError('the job hook itself is not run again')\n")
    (theirs / "sitecustomize.py").write_text("MARK = 'theirs'\n")
    monkeypatch.setenv(jobhook.JOB_ENV, str(theirs))  # another folder's job: nothing armed here
    jobhook.run_at_startup(str(here))
    assert sys.modules["sitecustomize"].MARK == "theirs"
    assert jobhook._folder is None


def test_a_broken_hidden_sitecustomize_is_told_as_site_tells_it_and_never_raises(hidden_sitecustomize, capsys):
    here, theirs = hidden_sitecustomize
    (theirs / "sitecustomize.py").write_text("raise RuntimeError('their bug')\n")
    jobhook.run_at_startup(str(here))
    assert capsys.readouterr().err == (
        "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nRuntimeError: their bug\n"
    )


def test_a_folder_others_may_write_or_a_symlink_arms_nothing(tmp_path, monkeypatch):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert jobhook._ours(str(private))
    (tmp_path / "link").symlink_to(private)
    assert not jobhook._ours(str(tmp_path / "link"))
    private.chmod(0o777)
    assert not jobhook._ours(str(private))
    monkeypatch.setenv(jobhook.JOB_ENV, str(private))
    monkeypatch.delitem(sys.modules, "sitecustomize", raising=False)
    jobhook.run_at_startup(str(private))
    assert jobhook._folder is None


@pytest.mark.parametrize(
    ("argv", "helper"),
    [
        (
            ["python", "-c", "from multiprocessing.spawn import spawn_main", "--multiprocessing-fork"],
            True,
        ),
        (["python", "-c", "from multiprocessing.forkserver import main; main(3)"], True),
        (["python", "train.py", "--lr", "0.1"], False),
        (["python", "-m", "torch.distributed.run", "train.py"], False),
    ],
)
def test_multiprocessing_helpers_are_told_from_ranks(monkeypatch, argv, helper):
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert jobhook._multiprocessing_helper() is helper


def test_the_hook_written_for_a_job_loads_this_hook(tmp_path):
    job._write_hook(tmp_path)
    text = (tmp_path / "sitecustomize.py").read_text()
    compile(text, "sitecustomize.py", "exec")
    assert repr(os.path.realpath(jobhook.__file__)) in text
    assert list((tmp_path / "__pycache__").iterdir())  # compiled: no process of the job writes it


def test_leaving_the_default_process_group_keeps_what_was_measured_first(monkeypatch):
    from types import SimpleNamespace

    from loaderdoctor.job import process

    calls = []
    dist = SimpleNamespace(destroy_process_group=lambda group=None: calls.append(("destroyed", group)))
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    every = SimpleNamespace(pid=os.getpid(), left_group=lambda: calls.append(("kept", None)))
    process._keep_as_the_group_ends(every)
    process._keep_as_the_group_ends(every)  # wrapped once
    dist.destroy_process_group()
    dist.destroy_process_group("a subgroup")  # not the process leaving its job
    assert calls == [("kept", None), ("destroyed", None), ("destroyed", "a subgroup")]


@pytest.mark.parametrize("left_group", [True, False])
def test_a_process_that_wrote_nothing_at_its_exit_is_said_by_how_it_kept_what_it_measured(left_group):
    from types import SimpleNamespace

    runs = [SimpleNamespace(report=SimpleNamespace(recording=SimpleNamespace(wall_s=wall_s))) for wall_s in (1.5, 1.2)]
    said = job._ended_unwritten({"pid": 7, "rank": 1, "left_group": left_group}, runs)  # type: ignore[arg-type]
    if left_group:  # Ray Train's worker, ended by Ray once its training is over
        assert said == ("process 7 (rank 1) ended without writing what it measured at its exit, after it left its "
                        "process group (as Ray ends its workers): its diagnosis covers all of its 1.5 s, up to its "
                        "last epoch's end, kept as it left")  # fmt: skip
    else:
        assert said.startswith("process 7 (rank 1) ended without writing what it measured (killed, os._exit, or a")
        assert said.endswith("its diagnosis covers its first 1.5 s, as it kept them when an epoch ended")
