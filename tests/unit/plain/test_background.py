"""The one background-thread lifecycle (plain/background.py), and the watchdog, poller and profiler on it."""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import dataclass, field

import pytest

from loaderdoctor.plain.background import BackgroundThread
from loaderdoctor.tap.watchdog import StallNotice, StallPolicy, Watchdog
from loaderdoctor.workers.poller import WorkerPoller
from loaderdoctor.workers.sites import SiteProfiler, thread_cpu_clock

pytestmark = pytest.mark.timeout(10)


def _named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_it_ticks_until_stopped_and_stop_waits_for_the_thread():
    ticked = threading.Event()
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) >= 3:
            ticked.set()

    thread = BackgroundThread("loaderdoctor-test-ticks", tick, 0.001).start()
    assert thread.name == "loaderdoctor-test-ticks" and _named("loaderdoctor-test-ticks")
    assert ticked.wait(5.0)
    assert thread.is_alive() and not thread.stopping
    thread.stop()
    assert thread.stopping and not thread.is_alive() and not _named("loaderdoctor-test-ticks")
    after = len(ticks)
    thread.join(timeout=0.05)
    assert len(ticks) == after  # no tick once stop() has returned


def test_wake_runs_the_next_tick_now_instead_of_after_the_interval():
    ticked = threading.Event()
    thread = BackgroundThread("loaderdoctor-test-wake", ticked.set, 60.0).start()
    try:
        assert not ticked.wait(0.2)  # a minute's interval: no tick of its own
        thread.wake()
        assert ticked.wait(5.0)
    finally:
        thread.stop()
    assert not thread.is_alive()


def test_stop_twice_and_stop_before_start_are_harmless():
    never = BackgroundThread("loaderdoctor-test-never", lambda: None, 0.001)
    never.stop()
    never.stop()
    assert never.stopping and not never.is_alive()

    thread = BackgroundThread("loaderdoctor-test-twice", lambda: None, 0.001).start()
    thread.stop()
    thread.stop()
    assert not thread.is_alive()


def test_a_tick_that_stops_its_own_thread_ends_it_without_waiting_for_itself():
    errors: list[BaseException] = []
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        try:
            thread.stop()  # from the thread itself: it must not join itself
            thread.stop()
        except BaseException as error:  # recorded, then asserted on
            errors.append(error)

    thread = BackgroundThread("loaderdoctor-test-self-stop", tick, 0.001)
    thread.start()
    thread.join(timeout=5.0)
    assert not thread.is_alive()
    assert errors == [] and ticks == [1]
    thread.stop()  # and once more from outside, after it ended


def test_a_tick_that_raises_ends_the_thread_and_is_reported(monkeypatch):
    reported: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", reported.append)

    def broken() -> None:
        raise ValueError("a bug in the tick")

    thread = BackgroundThread("loaderdoctor-test-broken", broken, 0.001).start()
    thread.join(timeout=5.0)
    assert not thread.is_alive()
    assert len(reported) == 1 and isinstance(reported[0].exc_value, ValueError)
    assert reported[0].thread is not None and reported[0].thread.name == "loaderdoctor-test-broken"
    thread.stop()


class _Owner:
    def __init__(self) -> None:
        self.thread = BackgroundThread("loaderdoctor-test-owner", self.tick, 0.001)

    def tick(self) -> None:
        pass


@pytest.mark.parametrize("started", [True, False])
def test_a_stopped_thread_lets_go_of_its_owner(started):
    """Its owner holds it and its tick holds the owner: once stopped, the owner (and a loader it may hold) goes
    with its last reference, not at the garbage collector's next pass."""
    gc.collect()
    gc.disable()
    try:
        owner = _Owner()
        if started:
            owner.thread.start()
        owner.thread.stop()
        gone = weakref.ref(owner)
        del owner
        assert gone() is None
    finally:
        gc.enable()


# The classes that run on it keep their names and their handling of a failed tick.


@dataclass
class _Waiting:
    waiting_since: float = 0.0
    started_at: float = 0.0
    delivered: int = 7
    index: int = 7
    epoch: int = 1
    pids: list[int] = field(default_factory=list)


@dataclass
class _FlakyTap:
    """A tap waiting for batch 7 since 0 s, whose clock fails the first `failures` times."""

    failures: int
    current: _Waiting = field(default_factory=_Waiting)
    slowest_wait_s: float = 0.0

    def clock(self) -> float:
        if self.failures > 0:
            self.failures -= 1
            raise OSError("a clock that failed once")
        return 100.0

    def batches_per_epoch(self) -> int | None:
        return None


def test_a_watchdog_whose_check_fails_logs_it_and_goes_on_to_fire(caplog):
    notices: list[StallNotice] = []
    dog = Watchdog(_FlakyTap(failures=2), StallPolicy(floor_s=1.0), notices.append, tick_s=0.001).start()
    dog._thread.join(timeout=5.0)  # it ends by itself once it has fired
    dog.stop()
    assert caplog.text.count("the watchdog's check failed; it goes on") == 2
    assert len(notices) == 1 and dog.fired is notices[0] and notices[0].batch == 7
    assert not _named("loaderdoctor-watchdog")


def test_a_stall_handler_may_stop_its_own_watchdog():
    errors: list[BaseException] = []

    def on_stall(notice: StallNotice) -> None:
        try:
            dog.stop()
        except BaseException as error:  # recorded, then asserted on
            errors.append(error)

    dog = Watchdog(_FlakyTap(failures=0), StallPolicy(floor_s=1.0), on_stall, tick_s=0.001)
    dog.start()  # after the name is bound: on_stall reads it
    dog._thread.join(timeout=5.0)
    assert dog.fired is not None and not dog._thread.is_alive() and errors == []


def test_the_worker_sampler_can_be_stopped_from_its_own_thread():
    """A pids() callback that stops the poller runs in the poller's thread: stop() returns the samples there
    (it used to join its own thread, a RuntimeError that ended the thread)."""
    returned: list[object] = []
    calls: list[int] = []

    def pids() -> list[int]:
        calls.append(1)
        if len(calls) == 1:
            try:
                returned.append(poller.stop())
            except BaseException as error:  # recorded, then asserted on
                returned.append(error)
        return []

    poller = WorkerPoller(pids, interval_s=0.001)
    poller.start()  # after the name is bound: pids() reads it
    poller._thread.join(timeout=5.0)
    assert not _named("loaderdoctor-poller")
    assert len(returned) == 1 and returned[0] is poller.readings
    assert calls == [1]  # no round after the one that stopped it
    assert poller.stop() is poller.readings


def test_the_site_sampler_keeps_its_name_and_writes_at_stop(tmp_path):
    ident = threading.get_ident()
    cpu_clock = thread_cpu_clock(ident)
    if cpu_clock is None:
        pytest.skip("no thread CPU clock on this platform")
    path = tmp_path / "activity.json"
    profiler = SiteProfiler(str(path), ident, cpu_clock, interval_s=0.001, flush_s=60.0).start()
    assert _named("loaderdoctor-site-profiler")
    profiler.stop()
    profiler.stop()
    assert not _named("loaderdoctor-site-profiler")
    assert path.exists()
