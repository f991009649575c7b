"""Measuring, what a measurement runs with: a copy per progress callback, and the one value a probe session and
the tuner's trials run with (in this process, no workers; the probe faked where only the threading is tested)."""

from __future__ import annotations

import dataclasses
import importlib
import time

import pytest
from recordings import make_recording
from torch.utils.data import DataLoader

from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.probe.measure import probe_with
from loaderdoctor.probe.measuring import Measuring, ProbeProgress
from loaderdoctor.probe.session import ProbeSession
from loaderdoctor.recording.rates import epoch_overhead_s
from loaderdoctor.tap.watchdog import StallPolicy
from shared_datasets import PlusMinus

tune_measure = importlib.import_module("loaderdoctor.tune.measure")
FIGURES = ProbeProgress(epoch=0, epochs=1, batches=5, elapsed_s=0.5, budget_s=10.0)
POLICY = StallPolicy(floor_s=5.0, first_batch_s=20.0)


SPEC = LoaderSpec.from_loader(DataLoader(PlusMinus(16), batch_size=2))


def _clock() -> float:
    return 0.0


def test_with_progress_is_a_copy_with_only_the_progress_changed():
    def step(batch: object) -> None:
        pass

    heard: list[ProbeProgress] = []
    measuring = Measuring(SPEC, step=step, policy=POLICY, clock=_clock)
    verifying = measuring.with_progress(heard.append)
    assert measuring.progress is None  # the original is untouched
    assert verifying.progress == heard.append
    assert (verifying.spec, verifying.step, verifying.policy, verifying.clock) == (SPEC, step, POLICY, _clock)
    with pytest.raises(dataclasses.FrozenInstanceError):
        verifying.step = None  # type: ignore[misc]


def test_a_measuring_has_the_probes_defaults():
    measuring = Measuring(SPEC)
    assert measuring.step is None and measuring.progress is None
    assert measuring.policy == StallPolicy()


@pytest.mark.timeout(30)
def test_a_session_runs_with_the_step_the_policy_and_the_progress_of_its_measuring():
    stepped: list[object] = []
    heard: list[ProbeProgress] = []
    measuring = Measuring(SPEC, step=stepped.append, policy=POLICY, progress=heard.append)
    session = ProbeSession(measuring, Settings())
    try:
        assert (session.spec, session.step, session.policy, session.progress) == (
            SPEC,
            stepped.append,
            POLICY,
            heard.append,
        )
    finally:
        session.close()
    rec = probe_with(measuring, budget_s=0.5, epochs=1)
    assert rec.outcome == "completed" and len(rec.batches) == 8
    assert len(stepped) == len(rec.batches)  # the training step after every batch
    assert heard and heard[-1].batches == len(rec.batches)


def _trial_measuring(monkeypatch) -> dict[str, Measuring]:
    """Fakes the probe of the tuner's trials: what each trial ran with, by its settings' workers."""
    given: dict[str, Measuring] = {}

    def fake_probe_with(measuring, settings=None, *, budget_s, epochs):
        given[settings.describe()] = measuring
        return make_recording(settings=settings)

    monkeypatch.setattr(tune_measure, "probe_with", fake_probe_with)
    return given


def test_a_trial_reports_its_figures_with_its_settings(monkeypatch):
    given = _trial_measuring(monkeypatch)
    heard: list[tuple[Settings, ProbeProgress]] = []
    measuring = Measuring(SPEC, policy=POLICY, progress=lambda figures: pytest.fail("the trial's own progress"))
    settings = Settings(num_workers=2)
    tune_measure.probe_measure(measuring, progress=lambda s, f: heard.append((s, f)))(settings, 1.0)
    trial = given[settings.describe()]
    assert trial.spec is SPEC and trial.policy is POLICY
    trial.progress(FIGURES)
    assert heard == [(settings, FIGURES)]


def test_without_a_progress_of_its_own_a_trial_reports_to_the_measurings(monkeypatch):
    given = _trial_measuring(monkeypatch)
    heard: list[ProbeProgress] = []
    measuring = Measuring(SPEC, progress=heard.append)
    tune_measure.probe_measure(measuring)(Settings(num_workers=2), 1.0)
    (trial,) = given.values()
    assert trial is measuring


@pytest.mark.timeout(30)
def test_an_epoch_cut_short_by_the_sessions_close_does_not_count_the_pause_before_it_as_its_end():
    # verify() closes every session after the last round: the time since this session's last window (the other
    # sessions' windows) is a pause, as between windows, not the epoch's end. Counted, it was the epoch overhead
    # of persistent workers' sessions, and a 6 s check read its fix's rate at half a plain loop's.
    offset = [0.0]

    def clock() -> float:
        return time.perf_counter() + offset[0]

    long_epochs = LoaderSpec.from_loader(DataLoader(PlusMinus(100_000), batch_size=2))  # no epoch ends in 0.05 s
    session = ProbeSession(Measuring(long_epochs, step=lambda batch: None, policy=POLICY, clock=clock), Settings())
    try:
        session.start(startup_limit_s=5.0)
        session.run(0.05, epochs=None)
        assert session.iterator is not None and session.epoch == 0  # the window ended within the first epoch
        offset[0] += 30.0  # the other sessions' windows
    finally:
        rec = session.close()
    assert rec.epochs[-1].ended == "time"
    assert rec.epochs[-1].end_s < 1.0
    assert epoch_overhead_s(rec) < 1.0
