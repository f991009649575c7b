"""The trainer callbacks' shared hook guard: loaderdoctor's failure never reaches the training run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.integrations.trainer.hooks import measuring


class Callback:
    def __init__(self) -> None:
        self._run = SimpleNamespace(broken=False, finished=False)
        self.calls = 0

    @measuring("_run", "the training")
    def on_step_end(self, fail: bool) -> None:
        self.calls += 1
        if fail:
            raise ValueError("a bug of loaderdoctor's")


def test_a_failing_hook_ends_the_measuring_with_one_warning_and_the_training_goes_on():
    callback = Callback()
    callback.on_step_end(False)
    with pytest.warns(LoaderDoctorWarning, match="stopped measuring the training: ValueError: a bug"):
        callback.on_step_end(True)  # raises nothing
    assert callback._run.broken
    callback.on_step_end(True)  # measured no more: not called, nothing said again
    assert callback.calls == 2


def test_no_hook_runs_before_the_run_or_after_its_end():
    callback = Callback()
    callback._run.finished = True
    callback.on_step_end(True)
    callback._run = None
    callback.on_step_end(True)
    assert callback.calls == 0
