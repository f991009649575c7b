"""The nodes' meeting in the job's store (job/meeting.py) and what node 0 gathers there (job/gathering.py), on this
machine's loopback: every node here is a thread's or this process's own TCPStore."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from recordings import make_recording

from loaderdoctor.job.gathering import NodeEnd, gather, rank_key, runs_text, so_far_key, tell_end
from loaderdoctor.job.loaders import LoaderRun
from loaderdoctor.job.meeting import Heartbeat, MeetingStopped, NodesDidNotMeet, meet
from loaderdoctor.report import LoaderReport
from loaderdoctor.scale.launch import free_port


def test_two_nodes_meet_and_each_knows_the_others_host():
    port = free_port()
    met = {}
    other = threading.Thread(target=lambda: met.update(one=meet("127.0.0.1", port, node_rank=1, nnodes=2,
                                                                  say=print)))  # fmt: skip
    other.start()  # before node 0 serves: it waits for something to answer
    time.sleep(0.5)
    zero = meet("127.0.0.1", port, node_rank=0, nnodes=2, say=print)
    other.join(10)
    assert set(zero.hosts) == {0, 1} and met["one"].hosts == zero.hosts
    assert met["one"].endpoint == zero.endpoint == f"127.0.0.1:{port}"


def test_a_node_that_never_comes_is_said_while_waited_for_and_named_when_the_wait_gives_up():
    said = []
    clock = iter(range(0, 1000, 1)).__next__  # one second a poll
    with pytest.raises(NodesDidNotMeet) as raised:
        meet("127.0.0.1", free_port(), node_rank=0, nnodes=3, timeout_s=12, say=said.append, clock=clock)
    assert said[0].startswith("waiting for 2 more nodes (nodes 1, 2) at 127.0.0.1:")
    assert "nodes 1, 2 did not join the job at 127.0.0.1:" in raised.value.message
    assert "within 12 s" in raised.value.message and "--nnodes 3" in raised.value.hint


def test_node_0_that_never_answers_is_said_and_named():
    said = []
    clock = iter(range(0, 1000, 1)).__next__
    with pytest.raises(NodesDidNotMeet) as raised:
        meet("127.0.0.1", free_port(), node_rank=1, nnodes=2, timeout_s=7, say=said.append, clock=clock)
    assert said == [f"waiting for node 0 at {raised.value.message.split(' at ')[1].split(' did')[0]} (nothing "
                    "answers there yet), 5 s"]  # fmt: skip
    assert "did not answer within 7 s" in raised.value.message


def test_sigterm_while_waiting_ends_the_meeting_with_the_signal():
    timer = threading.Timer(0.5, lambda: signal.raise_signal(signal.SIGTERM))
    timer.start()
    with pytest.raises(MeetingStopped) as raised:
        meet("127.0.0.1", free_port(), node_rank=0, nnodes=2, timeout_s=30, say=print)
    assert raised.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def _runs(name: str) -> list[LoaderRun]:
    return [LoaderRun(LoaderReport(name, make_recording(), []), "2026-12-02T00:00:00+00:00", {})]


def test_node_0_gathers_every_rank_the_last_words_first_and_a_node_that_stopped_beating_is_lost():
    port = free_port()
    zero = meet("127.0.0.1", port, node_rank=0, nnodes=3, timeout_s=5, say=print, clock=_ready_after_meet(port))
    store = zero.store
    store.set(rank_key(0), runs_text(_runs("t/rank0"), rank=0, host="a"))
    store.set(so_far_key(0), runs_text(_runs("t/rank0"), rank=0, host="a", so_far=True))  # its end stands
    store.set(so_far_key(1), runs_text(_runs("t/rank1"), rank=1, host="b", so_far=True))  # nothing at its end
    tell_end(_as_node(zero, 1), NodeEnd(1, "b", 137, "rank 1 failing", {"1": "was killed by SIGKILL"}))
    with Heartbeat(zero, lambda node, seconds: None, lost_s=0.5) as heartbeat:  # node 2 never beats
        gathered = gather(zero, heartbeat, 3, say=print)
    assert sorted(gathered.loaders) == [0, 1] and gathered.hosts == {0: "a", 1: "b"}
    assert list(gathered.so_far) == [1]
    ends = {end.node: end for end in gathered.node_ends}
    assert ends[1].words() == "node 1 (b) ended with exit status 137, by rank 1 failing (rank 1 was killed by SIGKILL)"
    assert ends[2].lost_after_s is not None and ends[2].words().startswith("node 2 (elsewhere) was lost")


def _ready_after_meet(port: int):
    """A clock for node 0's meeting whose other nodes come at once (this test plays them)."""
    from loaderdoctor.job.meeting import node_key, store_client

    def come() -> None:
        client = store_client(f"127.0.0.1:{port}")
        for node in (1, 2):
            client.set(node_key(node), '{"host": "elsewhere", "pid": 1}')

    threading.Timer(0.2, come).start()
    return time.monotonic


def _as_node(meeting, node: int):
    import dataclasses

    return dataclasses.replace(meeting, node_rank=node)
