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
