"""rank-straggler on hand-made Recordings of the ranks of one loader: the ranks the others wait for are named
together with their wait, their hosts, the share of the others' step spent waiting for them and the slowest one's
own findings; ranks that wait alike, or a few ms apart, are no straggler."""

from __future__ import annotations

from recordings import make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.report import Finding
from loaderdoctor.rules.straggler import rank_straggler, slow_ranks

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
        "rank 1 on node-b waits 190 ms per batch for data; the other ranks wait for it (184 ms of their 200 ms "
        "step, 92%)"
    )
    assert finding.severity == "critical"
    assert finding.evidence["rank"] == 1 and finding.evidence["host"] == "node-b"
    assert finding.evidence["ranks"] == [1] and finding.evidence["hosts"] == ["node-b"]
    assert finding.evidence["share_of_others_step"] == 0.925
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


def test_two_slow_ranks_of_four_on_one_node_are_named_together_with_their_node():
    # 2 nodes x 2 processes; node1's samples load slower: ranks 2 and 3 wait ~33 ms, ranks 0 and 1 have their
    # data ready and wait in the collective for them (28 ms of their 51 ms step).
    ranks = {0: _rank(0.004, 0.051), 1: _rank(0.005, 0.051), 2: _rank(0.032, 0.023), 3: _rank(0.033, 0.023)}
    hosts = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    finding = rank_straggler(ranks, hosts)
    assert finding is not None
    assert finding.title == (
        "ranks 2, 3 on node1 wait 32-33 ms per batch for data; the other ranks wait for them (28 ms of their 51 ms "
        "step, 55%)"
    )
    evidence = finding.evidence
    assert evidence["rank"] == 3 and evidence["host"] == "node1"  # the slowest, as before
    assert evidence["ranks"] == [2, 3] and evidence["hosts"] == ["node1"]
    assert evidence["share_of_others_step"] == 0.549
    assert evidence["others_median_wait_ms"] == 4.5  # the fast ranks' alone: the slow ones pull up no median
    assert "ranks 2, 3 (on node1) cost every rank" in finding.fix


def test_one_slow_rank_of_four_is_named_alone():
    ranks = {0: _rank(0.004, 0.090), 1: _rank(0.005, 0.091), 2: _rank(0.004, 0.089), 3: _rank(0.080, 0.015)}
    finding = rank_straggler(ranks, {0: "a", 1: "a", 2: "b", 3: "b"})
    assert finding is not None and finding.evidence["ranks"] == [3] and finding.evidence["hosts"] == ["b"]
    assert finding.title.startswith("rank 3 on b waits 80 ms per batch for data; the other ranks wait for it")


def test_slow_ranks_on_two_hosts_name_both_and_unknown_hosts_none():
    ranks = {0: _rank(0.004, 0.090), 1: _rank(0.080, 0.015), 2: _rank(0.004, 0.089), 3: _rank(0.080, 0.015)}
    finding = rank_straggler(ranks, {0: "a", 1: "b", 2: "a", 3: "c"})
    assert finding is not None and finding.evidence["hosts"] == ["b", "c"]
    assert finding.title.startswith("ranks 1, 3 on b, c wait 80 ms")
    finding = rank_straggler(ranks)
    assert finding is not None and finding.evidence["hosts"] == [] and finding.evidence["host"] is None
    assert finding.title.startswith("ranks 1, 3 wait 80 ms per batch")


def test_four_ranks_that_wait_alike_have_no_straggler():
    ranks = {rank: _rank(0.030, 0.050) for rank in range(4)}
    assert rank_straggler(ranks, {rank: "a" for rank in range(4)}) is None


def test_slow_ranks_are_judged_against_the_ranks_that_are_not():
    assert slow_ranks({0: 0.004, 1: 0.005, 2: 0.058, 3: 0.060}) == [2, 3]
    assert slow_ranks({0: 0.004, 1: 0.190, 2: 0.005}) == [1]
    assert slow_ranks({0: 0.004, 1: 0.060}) == [1]
    assert slow_ranks({0: 0.030, 1: 0.031, 2: 0.029}) == []
    # one fast rank of four: the others are no stragglers, it is the odd one out
    assert slow_ranks({0: 0.004, 1: 0.060, 2: 0.061, 3: 0.059}) == []
