"""signals.TemporaryHandler: in place only while needed, passing on what is not its own, never in a loop."""

from __future__ import annotations

import signal

import pytest

from loaderdoctor.signals import TemporaryHandler


@pytest.fixture
def sigusr2():
    before = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, before)


def test_a_handler_set_over_ours_still_reaches_the_one_before_and_a_reinstall_makes_no_loop(sigusr2):
    calls: list[str] = []
    signal.signal(signal.SIGUSR2, lambda s, f: calls.append("original"))

    def ours(signum, frame, previous):
        calls.append("ours")
        previous(signum, frame)

    handler = TemporaryHandler(signal.SIGUSR2, ours)
    assert handler.install() and handler.current()
    ours_in_place = signal.getsignal(signal.SIGUSR2)

    def users(signum, frame):  # a library that chains to what it replaced, as ours does
        calls.append("user")
        ours_in_place(signum, frame)

    signal.signal(signal.SIGUSR2, users)
    handler.uninstall()  # another handler is in place: it stays
    assert signal.getsignal(signal.SIGUSR2) is users and not handler.installed
    signal.raise_signal(signal.SIGUSR2)
    assert calls == ["user", "ours", "original"]

    calls.clear()
    assert handler.install()  # over the user's, which still calls the first one of ours
    signal.raise_signal(signal.SIGUSR2)
    assert calls == ["ours", "user", "ours", "original"]
    handler.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is users  # put back as found


@pytest.mark.timeout(30)
def test_child_deaths_are_quiet_in_the_block_and_the_handler_back_after_it():
    """torch's SIGCHLD handler raises a dead worker's error wherever the main thread is: while a run's watches
    close, it is not called (a child ended then is still there to be waited on), and it is back after."""
    import subprocess
    import sys
    import time

    from loaderdoctor.signals import child_deaths_quiet

    told: list[int] = []

    def handler(signum, frame):
        told.append(signum)

    previous = signal.signal(signal.SIGCHLD, handler)
    try:
        with child_deaths_quiet():
            assert subprocess.run([sys.executable, "-c", "raise SystemExit(3)"]).returncode == 3  # waited on
            time.sleep(0.1)
        assert told == [] and signal.getsignal(signal.SIGCHLD) is handler
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        time.sleep(0.1)
        assert told == [signal.SIGCHLD]
    finally:
        signal.signal(signal.SIGCHLD, previous)
