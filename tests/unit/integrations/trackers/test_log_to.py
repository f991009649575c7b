"""Choosing a tracker: `loaderdoctor.log_to` and `--log-to TRACKER` on check, tune, scale, run and report; a
tracker not installed, or unknown, is refused with exit status 2 before anything is measured, naming the extra
to install; a tracker's own failure is an error once the report was shown."""

from __future__ import annotations

import importlib.util

import pytest
from saved_reports import CHECK

import loaderdoctor
from loaderdoctor.cli import main
from loaderdoctor.commands.run import split_argv
from loaderdoctor.integrations.trackers.tensorboard import TensorBoardTracker
from loaderdoctor.saved import read_report

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def without_wandb(monkeypatch):
    """wandb as if it were not installed."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *more: None if name == "wandb" else find_spec(name, *more)
    )


def test_log_to_is_public():
    assert "log_to" in loaderdoctor.__all__ and callable(loaderdoctor.log_to)


def test_a_tracker_not_installed_is_refused_in_words_that_name_the_extra(without_wandb):
    with pytest.raises(loaderdoctor.UsageError, match="logging to wandb needs the wandb package") as raised:
        loaderdoctor.log_to(read_report(CHECK), "wandb")
    assert raised.value.hint == "pip install 'loaderdoctor[trackers]'"
    assert raised.value.exit_status == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "demo", "--budget", "1"],
        ["tune", "demo", "--budget", "1"],
        ["scale", "demo", "--budget", "1"],
        ["report", str(CHECK)],
        ["run", "train.py"],
    ],
    ids=["check", "tune", "scale", "report", "run"],
)
def test_every_command_takes_log_to_and_refuses_a_missing_tracker_before_it_runs(argv, without_wandb, capsys):
    # Nothing is measured (no worker, no script): the refusal comes as the arguments are read.
    assert main([*argv[:1], "--log-to", "wandb", *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert "logging to wandb needs the wandb package" in err and "pip install 'loaderdoctor[trackers]'" in err


def test_an_unknown_tracker_or_option_is_refused(capsys):
    pytest.importorskip("tensorboard")
    assert main(["check", "demo", "--log-to", "comet"]) == 2
    assert "unknown tracker 'comet': use one of wandb, mlflow, tensorboard" in capsys.readouterr().err
    with pytest.raises(loaderdoctor.UsageError, match="tensorboard takes no option 'logdir': it takes log_dir, step"):
        loaderdoctor.log_to(read_report(CHECK), "tensorboard", logdir="x")
    with pytest.raises(TypeError, match="not a report of check, tune or scale"):
        loaderdoctor.log_to({"schema": "loaderdoctor.check/1"}, "tensorboard")


def test_log_to_is_repeatable_and_run_keeps_it_as_its_own_before_the_script():
    own, script = split_argv(["--log-to", "mlflow", "--log-to=tensorboard", "train.py", "--log-to", "theirs"])
    assert own == ["--log-to", "mlflow", "--log-to=tensorboard"]
    assert script == ["train.py", "--log-to", "theirs"]


def test_a_trackers_own_failure_is_an_error_after_the_report_is_shown(monkeypatch, capsys):
    pytest.importorskip("tensorboard")

    def fails(self, summary, page):
        raise RuntimeError("the server went away")

    monkeypatch.setattr(TensorBoardTracker, "log", fails)
    assert main(["report", str(CHECK), "--log-to", "tensorboard"]) == 1
    captured = capsys.readouterr()
    assert "input-bound" in captured.out  # the report, shown first
    assert "could not log the report to tensorboard: RuntimeError: the server went away" in captured.err


def test_a_run_of_the_history_is_not_logged(capsys):
    assert main(["report", "latest", "--log-to", "tensorboard"]) == 2
    assert "--log-to logs a saved report" in capsys.readouterr().err
