"""prescribe() combines the findings' changes; verify() judges the measured fix (the probe faked)."""

from __future__ import annotations

import pytest
from recordings import make_iterators, make_recording

from loaderdoctor.errors import UsageError
from loaderdoctor.prescribe import prescribe, verify
from loaderdoctor.report import Finding
from loaderdoctor.settings import Settings

IN_MAIN_PROCESS = Settings()
MORE_WORKERS = {"num_workers": 2, "persistent_workers": True}
TWO_WORKERS = Settings(num_workers=2)


def _finding(rule: str = "input-bound", severity: str = "critical", **change) -> Finding:
    return Finding(rule=rule, severity=severity, title=rule, evidence={}, fix="", settings_change=change)


@pytest.fixture
def fork_by_default(monkeypatch):
    monkeypatch.setattr("loaderdoctor.settings.default_start_method", lambda: "fork")


# prescribe


def test_prescribe_applies_every_change():
    rec = make_recording(settings=IN_MAIN_PROCESS)
    findings = [_finding(**MORE_WORKERS), _finding("pin-memory", "warning", pin_memory=True)]
    assert prescribe(rec, findings) == Settings(num_workers=2, persistent_workers=True, pin_memory=True)


def test_the_main_diagnosis_wins_a_conflict():
    rec = make_recording(settings=IN_MAIN_PROCESS)
    findings = [
        _finding("worker-respawn", "critical", num_workers=4),
        _finding("cpu-oversubscription", "warning", num_workers=1, prefetch_factor=4),
    ]
    assert prescribe(rec, findings) == Settings(num_workers=4, prefetch_factor=4)


def test_info_findings_are_ignored():
    rec = make_recording(settings=IN_MAIN_PROCESS)
    assert prescribe(rec, [_finding("pin-memory", "info", pin_memory=True)]) is None
    findings = [_finding("pin-memory", "info", num_workers=8), _finding("input-bound", "warning", num_workers=2)]
    assert prescribe(rec, findings) == Settings(num_workers=2)


def test_none_when_nothing_changes():
    rec = make_recording(settings=Settings(num_workers=2, persistent_workers=True))
    assert prescribe(rec, []) is None
    assert prescribe(rec, [_finding("stall", "critical")]) is None  # a finding without a settings change
    assert prescribe(rec, [_finding(persistent_workers=True)]) is None  # already so


def test_none_when_the_change_is_dropped_as_invalid():
    rec = make_recording(settings=IN_MAIN_PROCESS)
    assert prescribe(rec, [_finding(persistent_workers=True)]) is None  # needs workers: dropped at 0


def test_adding_fork_workers_after_thread_hazards_switches_to_forkserver(fork_by_default):
    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(2, None, threads=["prefetcher"]))
    assert prescribe(rec, [_finding(**MORE_WORKERS)]) == Settings(
        num_workers=2, persistent_workers=True, start_method="forkserver"
    )


def test_adding_fork_workers_after_cuda_switches_to_forkserver(fork_by_default):
    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(1, None, cuda_initialized=True))
    assert prescribe(rec, [_finding(num_workers=3)]) == Settings(
        num_workers=3, persistent_workers=True, start_method="forkserver"
    )


def test_adding_fork_workers_without_hazards_keeps_the_default(fork_by_default):
    rec = make_recording(settings=IN_MAIN_PROCESS, iterators=make_iterators(2, None))
    assert prescribe(rec, [_finding(**MORE_WORKERS)]) == Settings(num_workers=2, persistent_workers=True)


def test_an_explicit_spawn_is_kept_despite_hazards(fork_by_default):
    rec = make_recording(
        settings=Settings(num_workers=1, start_method="spawn"),
        start_method="spawn",
        iterators=make_iterators(2, "spawn", threads=["t1"]),
    )
    assert prescribe(rec, [_finding(num_workers=2)]) == Settings(num_workers=2, start_method="spawn")


# verify


class FakeProbe:
    def __init__(self, result=None, error: Exception | None = None) -> None:
        self.result, self.error = result, error
        self.calls: list[tuple[object, Settings, dict]] = []

    def __call__(self, spec, settings, **kwargs):
        self.calls.append((spec, settings, kwargs))
        if self.error is not None:
            raise self.error
        return self.result


def _run(monkeypatch, before, after=None, *, findings=None, error=None, settings=TWO_WORKERS):
    fake = FakeProbe(after, error)
    monkeypatch.setattr("loaderdoctor.prescribe.probe", fake)
    findings = findings if findings is not None else [_finding(num_workers=2)]
    verification = verify("SPEC", before, findings, settings, budget_s=3.0, epochs=2, step=None)
    return verification, fake


def _rate(batches: int, wall_s: float = 4.0, **fields):
    """A recording of `batches` batches (two epochs) in `wall_s` seconds."""
    return make_recording(epochs=2, batches_per_epoch=batches // 2, wall_s=wall_s, **fields)


def test_verify_measures_the_settings_the_way_before_was_measured(monkeypatch):
    settings = Settings(num_workers=2, persistent_workers=True)
    _, fake = _run(monkeypatch, _rate(40), _rate(60), settings=settings)
    ((spec, probed, kwargs),) = fake.calls
    assert spec == "SPEC"
    assert probed == settings
    assert kwargs["budget_s"] == 3.0
    assert kwargs["epochs"] == 2


def test_helped_at_ten_percent_faster(monkeypatch):
    after = _rate(44)
    v, _ = _run(monkeypatch, _rate(40), after)  # 10 -> 11 batches/s
    assert (v.before, v.after) == (10.0, 11.0)
    assert v.speedup == pytest.approx(1.10)
    assert v.helped is True
    assert v.note == "1.10x faster, measured with the same budget and training step"
    assert v.after_recording is after
    assert (v.before_outcome, v.after_outcome) == ("completed", "completed")


def test_not_helped_at_five_percent_faster(monkeypatch):
    v, _ = _run(monkeypatch, _rate(40), _rate(42))
    assert v.helped is False
    assert v.note == "no measurable gain (1.05x): not a fix for this loader"


def test_helped_when_before_stalled_and_after_completed(monkeypatch):
    v, _ = _run(monkeypatch, _rate(40, outcome="stalled"), _rate(20))  # slower, but it finishes
    assert v.helped is True
    assert v.note == "delivered 20 batches where the original settings stalled"
    assert (v.before_outcome, v.after_outcome) == ("stalled", "completed")


def test_not_helped_when_after_fails_too(monkeypatch):
    v, _ = _run(monkeypatch, _rate(40, outcome="stalled"), _rate(80, outcome="crashed"))
    assert v.helped is False
    assert v.note == "the prescribed settings crashed too"


def test_a_safety_only_fix_helps_when_about_as_fast(monkeypatch):
    fork = [_finding("fork-unsafe", "warning", start_method="forkserver", persistent_workers=True)]
    v, _ = _run(monkeypatch, _rate(40), _rate(38), findings=fork)  # 0.95x
    assert v.helped is True
    assert v.note == "as fast (0.95x) without the hazard"


def test_a_safety_fix_that_costs_too_much_speed_does_not_help(monkeypatch):
    fork = [_finding("fork-unsafe", "warning", start_method="forkserver")]
    v, _ = _run(monkeypatch, _rate(40), _rate(34), findings=fork)  # 0.85x
    assert v.helped is False


def test_a_speed_fix_must_be_faster(monkeypatch):
    findings = [_finding("fork-unsafe", "warning", start_method="forkserver"), _finding(num_workers=2)]
    v, _ = _run(monkeypatch, _rate(40), _rate(38), findings=findings)  # input-bound contributes: not safety only
    assert v.helped is False
    assert v.note == "no measurable gain (0.95x): not a fix for this loader"


def test_a_failed_probe_is_a_failed_verification(monkeypatch):
    error = UsageError("the loader's dataset (Locked) cannot be pickled")
    v, _ = _run(monkeypatch, _rate(40), error=error)
    assert v.after_outcome == "failed"
    assert v.helped is False
    assert v.after == 0.0
    assert v.before == 10.0
    assert v.note.startswith("not measured: the loader's dataset (Locked) cannot be pickled")
    assert v.after_recording is None
    assert v.to_dict()["after_outcome"] == "failed"
