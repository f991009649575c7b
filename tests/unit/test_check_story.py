"""One report tells one story: a finding whose fix was measured as no fix is not left as advice."""

from __future__ import annotations

from recordings import make_recording

from loaderdoctor.check import _with_measured_advice
from loaderdoctor.loader.settings import Settings
from loaderdoctor.report import Finding, Verification

ORIGINAL = Settings(num_workers=0)
MORE_WORKERS = {"num_workers": 2, "persistent_workers": True}


def _finding(change: dict) -> Finding:
    return Finding(
        rule="input-bound",
        severity="critical",
        title="The training step waits for data 60% of the time",
        evidence={"wait_fraction": 0.6},
        fix="Use 2 workers.",
        snippet="loader = DataLoader(dataset, num_workers=2)",
        settings_change=change,
        impact=0.6,
    )


def _verification(verdict: str, after: float) -> Verification:
    return Verification(
        settings=ORIGINAL.replace(**MORE_WORKERS),
        before=20.0,
        after=after,
        before_outcome="completed",
        after_outcome="completed",
        verdict=verdict,
        note="",
    )


def test_a_fix_measured_as_no_gain_is_not_left_as_advice():
    rec = make_recording(settings=ORIGINAL)
    (amended,) = _with_measured_advice([_finding(MORE_WORKERS)], rec, _verification("no-gain", 20.4))
    assert amended.snippet is None and amended.settings_change == {}
    assert amended.fix.startswith("Measured here in turns")
    assert "1.02x" in amended.fix and "not a fix" in amended.fix
    assert amended.severity == "critical" and amended.evidence == {"wait_fraction": 0.6}  # the evidence stands


def test_a_fix_measured_faster_is_left_as_it_is():
    rec = make_recording(settings=ORIGINAL)
    finding = _finding(MORE_WORKERS)
    assert _with_measured_advice([finding], rec, _verification("faster", 40.0)) == [finding]


def test_a_finding_whose_change_was_not_the_one_measured_keeps_its_advice():
    rec = make_recording(settings=ORIGINAL)
    other = _finding({"pin_memory": True})
    assert _with_measured_advice([other], rec, _verification("slower", 10.0)) == [other]


def test_an_oversubscription_whose_fix_was_measured_as_no_fix_falls_to_info_and_the_waits_lead():
    # Its cost is the wait it would explain: measured, limiting the pools explained none of it (OpenCV's pool on
    # 2 cores, quiet), and the report's main finding is the one the waits show, as it is beside busy processes.
    pools = {"worker_threads": 1}
    rec = make_recording(settings=Settings(num_workers=2))
    waits = _finding({})
    oversubscribed = Finding(
        rule="cpu-oversubscription",
        severity="critical",
        title="2 workers × 3 busy threads compete for 2 usable cores",
        evidence={"busy_threads_per_worker": 3},
        fix="Loading runs more threads than the cores can serve.",
        snippet="worker_init_fn=...",
        settings_change=pools,
        impact=0.6,
    )
    verification = _verification("no-gain", 20.4)
    verification.settings = rec.settings.replace(**pools)
    first, second = _with_measured_advice([oversubscribed, waits], rec, verification)
    assert first is waits
    assert second.rule == "cpu-oversubscription" and second.severity == "info" and second.impact == 0.0
    assert "worker_threads=1 was not a fix" in second.fix and second.snippet is None
    assert second.evidence == {"busy_threads_per_worker": 3}
