"""--budget bounds everything: a target that never returns from its import or its function is an error naming where
it is stuck, and a training step longer than the whole budget is refused before anything runs."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loaderdoctor.cli import main
from loaderdoctor.errors import UsageError
from loaderdoctor.probe.budget import check_budget
from loaderdoctor.tap.interrupt import INTERRUPT_SIGNAL
from loaderdoctor.targets.resolve import resolve
from loaderdoctor.targets.timelimit import TimeLimit, TimeLimitPassed

pytestmark = pytest.mark.timeout(90)

_CLI = str(Path(sys.executable).with_name("loaderdoctor"))
# The line of each target below where it sleeps for ten minutes, far past any budget here.
SLEEPS_ON_IMPORT = """
import time

time.sleep(600)


def loaders():
    return None
"""
SLEEPS_IN_FUNCTION = """
import time


def _read_index():
    time.sleep(600)


def loaders():
    _read_index()
"""


def _write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_a_block_past_its_limit_is_ended_with_the_stack_where_it_waited():
    handler_before = signal.getsignal(INTERRUPT_SIGNAL)
    with pytest.raises(TimeLimitPassed) as passed, TimeLimit(0.3):
        time.sleep(600)  # the line the stack must name; slept out, it would pass the test's timeout
    frame = passed.value.stack.stuck_frame
    assert frame is not None and frame.file == __file__ and frame.function.startswith("test_a_block")
    assert signal.getsignal(INTERRUPT_SIGNAL) is handler_before


def test_a_block_that_swallows_the_interrupt_still_ends_as_over_its_limit():
    def catches_everything() -> str:
        try:
            time.sleep(600)
        except BaseException:
            return "went on"  # ...but its end is still an error
        return "slept"

    with pytest.raises(TimeLimitPassed), TimeLimit(0.3):
        catches_everything()


def test_a_block_within_its_limit_and_a_block_without_one_run_as_they_are():
    with TimeLimit(30):
        value = sum(range(10))
    with TimeLimit(None):
        value += 1
    assert value == 46


def test_resolving_a_target_stuck_in_its_function_names_the_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, "stuck_in_function", SLEEPS_IN_FUNCTION)
    with pytest.raises(UsageError) as error:
        resolve(f"{path.name}:loaders", limit_s=0.5)
    message = error.value.message
    assert "did not return its loaders within 0.5 s" in message
    assert "stuck at stuck_in_function.py:6 in _read_index" in message
    assert "stuck_in_function.py:10 in loaders" in message  # the calls that led there


def test_a_step_longer_than_the_budget_is_refused():
    with pytest.raises(UsageError, match="longer than the budget"):
        check_budget(5, step_ms=1e9)
    check_budget(5, step_ms=4000)  # fits: measured, if only a few batches
    check_budget(5)


@pytest.mark.parametrize("command", ["check", "tune", "scale"])
def test_the_command_line_refuses_a_step_longer_than_the_budget_at_once(command, capsys):
    assert main([command, "--step-ms", "1e9", "--budget", "5", "--no-history"]) == 2
    err = capsys.readouterr().err
    assert "a training step of 1e+09 ms is longer than the budget of 5 s" in err


@pytest.mark.workers
def test_check_of_a_module_stuck_on_import_ends_with_where_it_sleeps(tmp_path):
    path = _write(tmp_path, "stuck_on_import", SLEEPS_ON_IMPORT)
    done = subprocess.run(
        [_CLI, "check", f"{path.name}:loaders", "--budget", "3", "--no-history"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=80,  # the module sleeps 600 s: ending before this is the budget's doing
    )
    assert done.returncode == 2, done.stderr
    assert "did not return its loaders within" in done.stderr
    assert "stuck at stuck_on_import.py:4 in <module>" in done.stderr
    assert "Traceback" not in done.stderr


def test_check_of_a_function_that_never_returns_ends_with_where_it_sleeps(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, "never_returns", SLEEPS_IN_FUNCTION)
    assert main(["check", f"{path.name}:loaders", "--budget", "1", "--no-history"]) == 2
    err = capsys.readouterr().err
    assert "stuck at never_returns.py:6 in _read_index" in err
