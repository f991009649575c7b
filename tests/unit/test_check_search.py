"""check's use of the tuner's quick mode: when it searches, and when the searched settings replace the rules' fix
(the tuner and the probe faked)."""

from __future__ import annotations

import importlib

import pytest
import torch
from recordings import make_recording
from torch.utils.data import DataLoader, TensorDataset

from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.probe.measuring import Measuring, ProbeProgress
from loaderdoctor.report import Finding, Verification
from loaderdoctor.tap.watchdog import StallPolicy
from loaderdoctor.tune.result import LoaderTuning
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.trial import Measurement, Trial

# The module, not the function loaderdoctor.check that shadows it on the package.
check_module = importlib.import_module("loaderdoctor.check")

RULES_FIX = Settings(num_workers=2, prefetch_factor=2, persistent_workers=True)
SEARCHED = Settings(num_workers=8, prefetch_factor=2, persistent_workers=True)
LIMITS = Limits(2.0, 2**30, None, 64, None, False, False)
FIGURES = ProbeProgress(epoch=0, epochs=2, batches=5, elapsed_s=0.5, budget_s=50.0)


def _finding() -> Finding:
    return Finding("input-bound", "critical", "slow", {}, "", settings_change={"num_workers": 2})


def _verification(settings: Settings, after: float, *, helped: bool = True) -> Verification:
    verdict = "faster" if helped else "no-gain"
    return Verification(settings, 10.0, after, "completed", "completed", verdict, f"{after / 10:.2f}x faster")


def _tuning(settings: Settings) -> LoaderTuning:
    baseline = Trial(1, Settings(), "baseline", "measured", [Measurement(10.0, "completed", 1.0)])
    chosen = Trial(2, settings, "workers", "measured", [Measurement(50.0, "completed", 1.0)])
    return LoaderTuning("train", [baseline, chosen], baseline, chosen, LIMITS, 10.0, "converged", None)


@pytest.mark.parametrize(
    ("fixed", "worth"),
    [
        (RULES_FIX, True),
        (Settings(pin_memory=True), False),  # nothing about speed changes
    ],
)
def test_a_search_is_run_only_for_a_speed_fix_of_a_loader_that_ran(fixed, worth):
    ran = make_recording(settings=Settings())
    assert check_module._worth_a_search(ran, fixed) is worth
    assert check_module._worth_a_search(make_recording(settings=Settings(), outcome="stalled"), RULES_FIX) is False


def _chosen(searched_after: float, *, rules_helped: bool = True) -> Verification:
    rules = _verification(RULES_FIX, 30.0, helped=rules_helped)
    return check_module._chosen([rules, _verification(SEARCHED, searched_after)], searched_trials=6)


def test_the_searched_settings_replace_the_rules_fix_when_measured_faster():
    chosen = _chosen(searched_after=45.0)
    assert chosen.settings == SEARCHED and chosen.source == "tune"
    assert "quick measured search of 6 trials" in chosen.note and "1.50x the rules' fix" in chosen.note


def test_the_rules_fix_stays_when_the_search_is_not_clearly_faster():
    chosen = _chosen(searched_after=31.0)  # 1.03x: within the margin
    assert chosen.settings == RULES_FIX and chosen.source == "rules"


def test_the_searched_settings_win_where_the_rules_fix_did_not_help():
    chosen = _chosen(searched_after=31.0, rules_helped=False)
    assert chosen.settings == SEARCHED and chosen.source == "tune"


def test_the_search_reuses_the_checks_measurement_as_its_baseline(monkeypatch):
    seen = {}

    def fake_tune_loader(name, measuring, **kwargs):
        seen.update(kwargs)
        return _tuning(SEARCHED)

    monkeypatch.setattr(check_module, "tune_loader", fake_tune_loader)
    spec = LoaderSpec.from_loader(DataLoader(TensorDataset(torch.arange(8.0))))
    rec = make_recording(settings=Settings())
    found, trials = check_module._search("train", Measuring(spec), rec, search_s=20.0)
    assert (found, trials) == (SEARCHED, 2)
    baseline_rec, baseline_run = seen["baseline"]
    assert baseline_rec is rec and baseline_run.batches_per_s > 0
    assert seen["quick"] is True


def test_each_phase_of_a_check_runs_with_the_loaders_measuring_and_reports_under_its_own_name(monkeypatch):
    given: dict[str, Measuring] = {}
    rec = make_recording(settings=Settings())

    def fake_probe_with(measuring, settings=None, *, budget_s, epochs):
        given["measure"] = measuring
        return rec

    def fake_tune_loader(name, measuring, **kwargs):
        given["tune"] = measuring
        return _tuning(SEARCHED)

    def fake_verify(measuring, before, findings, candidates, **kwargs):
        given["verify"] = measuring
        return [_verification(settings, 30.0) for settings in candidates]

    monkeypatch.setattr(check_module, "probe_with", fake_probe_with)
    monkeypatch.setattr(check_module, "diagnose", lambda recording: [_finding()])
    monkeypatch.setattr(check_module, "prescribe", lambda recording, findings: RULES_FIX)
    monkeypatch.setattr(check_module, "tune_loader", fake_tune_loader)
    monkeypatch.setattr(check_module, "verify", fake_verify)
    spec = LoaderSpec.from_loader(DataLoader(TensorDataset(torch.arange(8.0))))
    measuring = Measuring(spec, step=lambda batch: None, policy=StallPolicy(floor_s=5.0))
    heard = []

    def progress(name: str, phase: str, figures: ProbeProgress) -> None:
        heard.append((name, phase, figures))

    check_module._check_loader("train", measuring, budget_s=200.0, epochs=2, verify_fix=True, progress=progress)
    assert list(given) == ["measure", "tune", "verify"]
    for phase in given.values():
        assert phase.with_progress(None) == measuring  # the loader's one measuring, each phase's progress its own
        phase.progress(FIGURES)
    assert heard == [("train", phase, FIGURES) for phase in ("measure", "tune", "verify")]
