"""The one stall responder: stacks first, then the caller's record, then the wait ended, even when recording
fails."""

from __future__ import annotations

import threading

import pytest

from loaderdoctor.recording.record import WorkerStack
from loaderdoctor.tap import stalls
from loaderdoctor.tap.watchdog import StallNotice


def _notice(pids: list[int]) -> StallNotice:
    return StallNotice(0, 3, 12.0, 10.0, "no batch for 12.0 s", pids)


@pytest.fixture
def killed(monkeypatch) -> list[list[int]]:
    calls: list[list[int]] = []
    monkeypatch.setattr(stalls, "dump_worker_stacks", lambda pids, folder: [WorkerStack(pid, [], None) for pid in pids])
    monkeypatch.setattr(stalls, "kill_workers", lambda pids: calls.append(list(pids)))
    return calls


def test_workers_are_killed_after_their_stacks_are_recorded(killed):
    recorded = []
    ended = stalls.respond_to_stall(
        _notice([11, 12]),
        dump_dir="/tmp",
        consumer=threading.current_thread(),
        interrupter=None,
        record=lambda stacks: recorded.append(([s.pid for s in stacks], list(killed))),
    )
    assert ended is stalls.Ended.KILLED and killed == [[11, 12]]
    assert recorded == [([11, 12], [])]  # recorded before the kill


def test_a_record_that_raises_still_ends_the_workers(killed):
    def broken(stacks: list[WorkerStack]) -> None:
        raise ValueError("a bug in the recording")

    with pytest.raises(ValueError, match="a bug in the recording"):
        stalls.respond_to_stall(
            _notice([7]), dump_dir="/tmp", consumer=threading.current_thread(), interrupter=None, record=broken
        )
    assert killed == [[7]]


def test_without_workers_and_without_an_interrupter_loading_is_waited_on(killed):
    ended = stalls.respond_to_stall(
        _notice([]), dump_dir="/tmp", consumer=threading.current_thread(), interrupter=None, record=lambda s: None
    )
    assert ended is stalls.Ended.WAITING and killed == []
