"""The watchdog's stall decisions at fake clock times, on a fake tap; and its thread, once."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from torch.utils.data import DataLoader

import loaderdoctor.tap.iterator
from loaderdoctor.tap.iterator import RecentWaits, Tap
from loaderdoctor.tap.watchdog import StallNotice, StallPolicy, Watchdog

POLICY = StallPolicy(floor_s=10.0, multiple=20.0, first_batch_s=60.0, first_batch_idle_s=10.0, idle_window_s=4.0)


@dataclass
class FakeIterator:
    waiting_since: float | None = None
    started_at: float = 100.0
    delivered: int = 0
    index: int = 0
    epoch: int = 0
    pids: list[int] = field(default_factory=list)


@dataclass
class FakeTap:
    current: FakeIterator | None = None
    slowest_wait_s: float = 0.0
    now: float = 0.0
    length: int | None = None

    def clock(self) -> float:
        return self.now

    def batches_per_epoch(self) -> int | None:
        return self.length


def _steady(waiting_since: float = 200.0, slowest_wait_s: float = 1.0, **kw) -> FakeTap:
    """Waiting for batch 7 of epoch 1 since `waiting_since`, after 7 delivered batches."""
    it = FakeIterator(waiting_since=waiting_since, delivered=7, index=7, epoch=1, pids=[11, 12], **kw)
    return FakeTap(current=it, slowest_wait_s=slowest_wait_s)


def _first(pids: list[int] | None = None) -> FakeTap:
    """Waiting for the first batch of epoch 2, iter() called at 100, next() at 100.5."""
    it = FakeIterator(waiting_since=100.5, started_at=100.0, delivered=0, index=0, epoch=2, pids=pids or [])
    return FakeTap(current=it)


def _never(notice: StallNotice) -> None:
    raise AssertionError("on_stall must not be called by check()")


class IdleAnswer:
    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.calls: list[tuple[list[int], float]] = []

    def __call__(self, pids: list[int], window_s: float) -> bool | None:
        self.calls.append((list(pids), window_s))
        return self.answer


def test_no_notice_without_an_iterator_or_while_not_waiting():
    assert Watchdog(FakeTap(), POLICY, _never).check(1e9) is None
    idle = FakeTap(current=FakeIterator(waiting_since=None, delivered=3))
    assert Watchdog(idle, POLICY, _never, deadline=0.0).check(1e9) is None


def test_threshold_is_the_larger_of_floor_and_multiple():
    assert POLICY.threshold_s(0.1, first_batch=False) == 10.0
    assert POLICY.threshold_s(2.0, first_batch=False) == 40.0
    assert POLICY.threshold_s(2.0, first_batch=True) == 60.0


def test_steady_stall_after_multiple_of_slowest_batch():
    tap = _steady(waiting_since=200.0, slowest_wait_s=1.0)  # threshold max(10, 20 x 1) = 20 s
    dog = Watchdog(tap, POLICY, _never)
    assert dog.check(219.9) is None
    notice = dog.check(220.5)
    assert notice == StallNotice(
        epoch=1,
        batch=7,
        waited_s=pytest.approx(20.5),
        threshold_s=20.0,
        reason="no batch for 20.5 s, over 20x the slowest recent batch (1.00 s) and the 10 s floor",
        pids=[11, 12],
    )


def test_steady_stall_never_before_the_floor():
    tap = _steady(waiting_since=200.0, slowest_wait_s=0.01)  # 20 x 0.01 = 0.2 s, but the floor is 10 s
    dog = Watchdog(tap, POLICY, _never)
    assert dog.check(209.9) is None
    notice = dog.check(210.1)
    assert notice is not None
    assert notice.threshold_s == 10.0


def test_notice_pids_are_a_copy():
    tap = _steady()
    notice = Watchdog(tap, POLICY, _never).check(1000.0)
    tap.current.pids.append(99)
    assert notice.pids == [11, 12]


def test_first_batch_counts_from_iter_and_waits_for_the_first_batch_deadline():
    dog = Watchdog(_first(), POLICY, _never)
    assert dog.check(159.9) is None  # 59.9 s after iter(), though only 59.4 s in next()
    notice = dog.check(160.2)
    assert notice.epoch == 2
    assert notice.batch == 0
    assert notice.waited_s == pytest.approx(60.2)
    assert notice.threshold_s == 60.0
    assert notice.reason == "no first batch 60.2 s after iter()"


def test_early_first_batch_stall_when_workers_are_idle():
    idle = IdleAnswer(True)
    dog = Watchdog(_first(pids=[21, 22]), POLICY, _never, workers_idle=idle)
    assert dog.check(109.9) is None
    assert idle.calls == []  # not asked before first_batch_idle_s
    notice = dog.check(110.5)
    assert idle.calls == [([21, 22], 4.0)]
    assert notice.threshold_s == 10.0
    assert notice.waited_s == pytest.approx(10.5)
    assert notice.reason == "no first batch 10.5 s after iter(), and the workers used no CPU in the last 4 s"
    assert notice.pids == [21, 22]


@pytest.mark.parametrize("answer", [False, None])
def test_no_early_first_batch_stall_when_workers_are_busy_or_unknown(answer):
    idle = IdleAnswer(answer)
    dog = Watchdog(_first(pids=[21]), POLICY, _never, workers_idle=idle)
    assert dog.check(130.0) is None
    assert idle.calls == [([21], 4.0)]
    assert dog.check(160.5).threshold_s == 60.0  # the first-batch deadline still holds


def test_no_early_first_batch_stall_without_worker_pids():
    idle = IdleAnswer(True)
    dog = Watchdog(_first(pids=[]), POLICY, _never, workers_idle=idle)
    assert dog.check(130.0) is None
    assert idle.calls == []


def test_budget_deadline_ends_a_wait_under_every_threshold():
    dog = Watchdog(_steady(waiting_since=200.0), POLICY, _never, deadline=204.0)
    assert dog.check(203.9) is None
    notice = dog.check(205.0)
    assert notice.threshold_s == pytest.approx(5.0)  # the wait itself: no policy threshold was passed
    assert notice.waited_s == pytest.approx(5.0)
    assert notice.reason == "the measuring budget ran out while waiting 5.0 s for this batch"


def test_budget_deadline_ends_a_first_batch_wait():
    dog = Watchdog(_first(), POLICY, _never, deadline=105.0)
    notice = dog.check(106.0)
    assert notice.reason == "the measuring budget ran out while waiting 6.0 s for this batch"


def test_budget_deadline_ends_a_first_batch_wait_with_busy_workers():
    busy = IdleAnswer(False)
    dog = Watchdog(_first(pids=[21]), POLICY, _never, workers_idle=busy, deadline=105.0)
    notice = dog.check(130.0)  # 30 s after iter(): past the budget, under the 60 s first-batch deadline
    assert notice is not None
    assert notice.reason.startswith("the measuring budget ran out")


def test_the_thread_calls_on_stall_once_and_stop_joins_it():
    tap = _steady(waiting_since=0.0)
    tap.now = 1000.0  # long past any threshold
    called = threading.Event()
    notices: list[StallNotice] = []

    def on_stall(notice: StallNotice) -> None:
        notices.append(notice)
        called.set()

    dog = Watchdog(tap, POLICY, on_stall, tick_s=0.001).start()
    try:
        assert called.wait(2.0)
    finally:
        dog.stop()
    assert not any(t.name == "loaderdoctor-watchdog" and t.is_alive() for t in threading.enumerate())
    assert len(notices) == 1
    assert dog.fired is notices[0]
    assert notices[0].batch == 7


def test_a_tick_while_the_tap_builds_its_iterator_is_harmless(monkeypatch):
    tap = Tap(DataLoader(list(range(4)), batch_size=2), [], start_method=None, clock=lambda: 100.0)
    dog = Watchdog(tap, POLICY, _never)
    ticks = []
    real_facts = loaderdoctor.tap.iterator.iterator_facts

    def facts_during_a_tick(epoch, start_method):
        ticks.append(dog.check(1e9))  # what the watchdog's thread may do at this very moment
        return real_facts(epoch, start_method)

    monkeypatch.setattr("loaderdoctor.tap.iterator.iterator_facts", facts_during_a_tick)
    iterator = tap.epoch(0)
    assert ticks == [None]
    assert [batch.tolist() for batch in iterator] == [[0, 1], [2, 3]]


def test_the_yardstick_follows_recent_batches_down_after_a_hiccup():
    waits = RecentWaits(size=4)  # blocks of 2 batches: the slowest of the last 2 to 4 batches
    seen = []
    for wait in (0.1, 30.0, 0.2, 0.1, 0.3, 0.1, 0.1, 0.1):
        waits.add(wait)
        seen.append(waits.slowest_s)
    # The hiccup counts while its block or the next is the latest; then the yardstick is back down.
    assert seen == [0.1, 30.0, 30.0, 0.2, 0.3, 0.3, 0.3, 0.1]
    assert RecentWaits().slowest_s == 0.0


def test_a_stall_handler_that_raises_is_logged_and_the_watchdog_ends(caplog):
    tap = _steady(waiting_since=0.0, slowest_wait_s=0.0)
    tap.now = 100.0

    def broken(notice):
        raise ValueError("a bug in the responder")

    dog = Watchdog(tap, StallPolicy(floor_s=1.0), broken, tick_s=0.01).start()
    dog._thread.join(timeout=5)
    assert dog.fired is not None and not dog._thread.is_alive()
    assert "the stall handler failed" in caplog.text


def test_the_wait_past_an_epochs_last_batch_is_allowed_as_long_as_a_start_up():
    """After the last batch next() waits for torch to end the workers: a spawned worker's exit beside a busy
    neighbour took 1.6 s against a 1.5 s floor, and was called a stall. That wait gets the start-up's allowance."""
    tap = _steady(waiting_since=200.0, slowest_wait_s=0.01)  # waiting after batch 7
    tap.length = 7  # of 7: every batch was delivered
    dog = Watchdog(tap, POLICY, _never)
    assert dog.check(215.0) is None  # past the 10 s floor, within the 60 s start-up allowance
    notice = dog.check(261.0)
    assert notice is not None and notice.threshold_s == 60.0
    assert notice.reason == "the epoch's end (its workers ended) not reached 61.0 s after its last batch"
    tap.length = 8  # a batch still to come: the floor stands
    assert Watchdog(tap, POLICY, _never).check(215.0) is not None
    tap.length = None  # unknown (an IterableDataset): the floor stands
    assert Watchdog(tap, POLICY, _never).check(215.0) is not None
