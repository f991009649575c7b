"""check's proof of a contended lock: the same settings measured again with the lock calls on read-only files
made no-ops, worded as the lock's cost (the measuring faked); a lock that guards writes gets no such run."""

from __future__ import annotations

import importlib
import time

import torch
from recordings import make_activity, make_recording
from torch.utils.data import DataLoader, TensorDataset

from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.probe.measuring import Measuring
from loaderdoctor.report import Verification
from loaderdoctor.rules import diagnose
from loaderdoctor.workers.activity import LockCalls

check_module = importlib.import_module("loaderdoctor.check")
FOUR_WORKERS = Settings(num_workers=4, persistent_workers=True)
SPEC = LoaderSpec.from_loader(DataLoader(TensorDataset(torch.arange(8.0))))


def _locked(lock_calls: LockCalls | None = None, **activity: object):
    return make_recording(
        settings=FOUR_WORKERS,
        wait_s=0.05,
        step_s=0.015,
        cpu_share=0.02,
        worker_activity=make_activity(lock_calls=lock_calls, **activity),  # type: ignore[arg-type]
    )


def _fake_verify(seen: dict, verdict: str, after: float):
    def verify(measuring, before, findings, candidates, **kwargs):
        seen.update(candidates=candidates, lock_free=kwargs.get("lock_free", False))
        measured = _locked(LockCalls(read_only_exclusive=2728, made_free=2728), lock_free=True)
        note = "1.90x faster (4 pairs of windows, 1.80x to 2.00x), measured in turns with the same training step"
        spread = (after / 10.0 - 0.1, after / 10.0 + 0.1)
        verification = Verification(
            candidates[0], 10.0, after, "completed", "completed", verdict, note,
            after_recording=measured, spread=spread, pairs=4,
        )  # fmt: skip
        return [verification]

    return verify


def _checked(monkeypatch, rec, verdict: str = "faster", after: float = 19.0):
    seen: dict = {}
    monkeypatch.setattr(check_module, "verify", _fake_verify(seen, verdict, after))
    report = check_module._fix_and_verify(
        "train", Measuring(SPEC), rec, diagnose(rec), time.monotonic() + 10.0, True, None
    )
    return report.verification, seen


def test_a_lock_on_read_only_files_is_measured_away_with_the_same_settings(monkeypatch):
    rec = _locked()
    verification, seen = _checked(monkeypatch, rec)
    assert seen == {"candidates": [FOUR_WORKERS], "lock_free": True}
    assert verification.source == "lock-free"
    assert verification.note == (
        "without the lock on read-only files: 1.90x faster (4 pairs of windows, 1.80x to 2.00x), measured in "
        "turns with the same training step; 2728 lock calls made no-ops, in the workers only"
    )


def test_no_gain_without_the_lock_says_the_lock_is_not_the_cause(monkeypatch):
    verification, _ = _checked(monkeypatch, _locked(), verdict="no-gain", after=10.2)
    assert verification.note.startswith(
        "without the lock on read-only files: no measurable gain (1.02x; 4 pairs of windows, 0.92x to 1.12x): "
        "the lock is not what holds the workers back"
    )


def test_a_lock_that_guards_writes_gets_the_rules_fix_measured_instead(monkeypatch):
    rec = _locked(LockCalls(writable=300))
    assert diagnose(rec)[0].rule == "lock-contention"
    verification, seen = _checked(monkeypatch, rec)
    assert seen["lock_free"] is False
    assert seen["candidates"] != [FOUR_WORKERS]  # input-bound's change of settings
    assert verification.source == "rules"
