"""rank-straggler on hand-made Recordings of the ranks of one loader: the rank the others wait for is named with
its wait, its host and its own findings; ranks that wait alike, or a few ms apart, are no straggler."""

from __future__ import annotations

from recordings import make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.report import Finding
from loaderdoctor.rules.straggler import rank_straggler

SETTINGS = Settings(num_workers=2, persistent_workers=True)


def _rank(wait_s: float, step_s: float):
    return make_recording(settings=SETTINGS, epochs=2, batches_per_epoch=30, wait_s=wait_s, step_s=step_s)


def test_the_rank_the_others_wait_for_is_named():
    # rank 1 reads slow storage: 190 ms for each batch; ranks 0 and 2 have theirs ready and wait in the
    # collective for rank 1, so their step is ~180 ms longer than rank 1's.
    ranks = {0: _rank(0.004, 0.200), 1: _rank(0.190, 0.015), 2: _rank(0.005, 0.199)}
    slow_disk = Finding("lock-contention", "critical", "workers wait on flock", {}, "remove the lock", impact=0.5)
    finding = rank_straggler(ranks, {0: "node-a", 1: "node-b", 2: "node-a"}, {1: [slow_disk]})
    assert finding is not None and finding.rule == "rank-straggler"
    assert finding.title == (
        "rank 1 waits 190 ms per batch for data on node-b; the others wait for rank 1 (their step takes 184 ms "
        "longer than rank 1's)"
    )
    assert finding.severity == "critical"
    assert finding.evidence["rank"] == 1 and finding.evidence["host"] == "node-b"
    assert finding.evidence["rank_findings"] == ["lock-contention"]
    assert "remove the lock" in finding.fix and "rank 1 (on node-b)" in finding.fix


def test_ranks_that_wait_alike_have_no_straggler():
    assert rank_straggler({0: _rank(0.050, 0.020), 1: _rank(0.060, 0.020)}) is None


def test_a_few_milliseconds_more_is_no_straggler():
    # three times the other's wait, but 4 ms a batch against a 100 ms step
    assert rank_straggler({0: _rank(0.002, 0.100), 1: _rank(0.006, 0.098)}) is None


def test_one_rank_alone_is_never_a_straggler():
    assert rank_straggler({0: _rank(0.300, 0.020)}) is None


def test_a_rank_that_waits_alone_without_holding_the_others_is_no_straggler():
    # rank 1 waits 150 ms but the others' step is no longer than its own: nothing ties them (no collective)
    assert rank_straggler({0: _rank(0.004, 0.020), 1: _rank(0.150, 0.020), 2: _rank(0.004, 0.021)}) is None
