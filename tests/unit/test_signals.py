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
