"""signals.TemporaryHandler: in place only while needed, passing on what is not its own, never in a loop."""

from __future__ import annotations

import signal

import pytest

from loaderdoctor.tap.signals import TemporaryHandler


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
@pytest.mark.workers
def test_child_deaths_are_quiet_in_the_block_and_the_handler_back_after_it():
    """torch's SIGCHLD handler raises a dead worker's error wherever the main thread is: while a run's watches
    close, it is not called (a child ended then is still there to be waited on), and it is back after."""
    import subprocess
    import sys
    import time

    from loaderdoctor.tap.signals import child_deaths_quiet

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


class _Stop(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@pytest.mark.timeout(30)
def test_a_raising_signal_swallowed_in_a_del_is_sent_again_and_raises_where_it_can(sigusr2):
    """Python only prints an exception raised in a __del__ (as in a fork hook): the signal comes again."""
    import sys
    import time

    from loaderdoctor.tap.signals import SignalRaises

    hook_before = sys.unraisablehook

    class Dropped:
        def __del__(self):
            signal.raise_signal(signal.SIGUSR2)  # its handler runs here, where the exception is swallowed
            for _ in range(1000):
                pass

    raises = SignalRaises(signal.SIGUSR2, _Stop)
    with raises:
        assert sys.unraisablehook is not hook_before
        with pytest.raises(_Stop) as stopped:
            Dropped()  # dropped at once: __del__ runs, the exception in it is swallowed
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.001)  # ... and raised again here
        assert stopped.value.signum == signal.SIGUSR2 and raises.received == signal.SIGUSR2
    assert sys.unraisablehook is hook_before and signal.getsignal(signal.SIGUSR2) is not None
    assert not raises.installed


def test_a_raising_signal_leaves_a_handler_that_was_there_before_and_an_ignored_signal_ignored(sigusr2):
    from loaderdoctor.tap.signals import SignalRaises

    calls: list[int] = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    with SignalRaises(signal.SIGUSR2, _Stop) as raises:
        signal.raise_signal(signal.SIGUSR2)  # the program's own handler gets it; nothing raised
    assert calls == [signal.SIGUSR2] and raises.received is None

    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # as nohup leaves SIGHUP
    with SignalRaises(signal.SIGUSR2, _Stop) as raises:
        signal.raise_signal(signal.SIGUSR2)
    assert raises.received is None and signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN


def test_an_unraisable_hook_set_over_ours_stays_and_other_exceptions_reach_the_one_before(sigusr2):
    import sys

    from loaderdoctor.tap.signals import SignalRaises

    seen: list[BaseException] = []
    hook_before = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: seen.append(unraisable.exc_value)
    try:
        with SignalRaises(signal.SIGUSR2, _Stop):

            class Broken:
                def __del__(self):
                    raise ValueError("not ours")

            Broken()
            assert [type(error) for error in seen] == [ValueError]  # passed on

            def users_hook(unraisable):
                pass

            sys.unraisablehook = users_hook
        assert sys.unraisablehook is users_hook  # set over ours: left in place
    finally:
        sys.unraisablehook = hook_before


def _raised_in(stopped: pytest.ExceptionInfo) -> list[str]:
    """The files of the frames the exception went up through, innermost last: the handler's own left out."""
    import traceback

    from loaderdoctor.tap import signals

    steps = traceback.extract_tb(stopped.value.__traceback__)
    return [step.filename for step in steps if step.filename != signals.__file__]


@pytest.mark.timeout(30)
def test_a_raising_signal_that_comes_inside_the_standard_librarys_code_raises_once_it_has_returned(sigusr2):
    """logging's fork hook gives its lock back in code of its own: an exception raised there would leave the lock
    held. Held back, the signal raises in the program's code once the library's returns."""
    import threading
    import time

    from loaderdoctor.tap.signals import SignalRaises

    waited = threading.Event()
    sender = threading.Timer(0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR2))
    with SignalRaises(signal.SIGUSR2, _Stop) as raises:
        sender.start()
        with pytest.raises(_Stop) as stopped:
            waited.wait(0.3)  # threading.py's code, its wait interrupted by the signal at 0.05 s
            returned_at = time.monotonic()
            while time.monotonic() < returned_at + 5:
                pass  # ours: it raises here
        sender.join()
    assert raises.received == signal.SIGUSR2
    assert _raised_in(stopped)[-1] == __file__, _raised_in(stopped)


@pytest.mark.timeout(30)
def test_a_raising_signal_held_back_in_a_wait_that_does_not_return_still_raises_there(sigusr2):
    import threading
    import time

    from loaderdoctor.tap import signals

    never = threading.Event()
    sender = threading.Timer(0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR2))
    with signals.SignalRaises(signal.SIGUSR2, _Stop):
        sender.start()
        started = time.monotonic()
        with pytest.raises(_Stop) as stopped:
            never.wait()  # no timeout: only the exception ends it
        waited = time.monotonic() - started
        sender.join()
    assert signals.WAIT_FOR_SAFE_S <= waited < 10 and _raised_in(stopped)[-1] == threading.__file__


@pytest.mark.timeout(30)
@pytest.mark.workers
def test_a_process_forked_while_a_signal_raises_ends_by_that_signal_as_without_it(sigusr2):
    """A DataLoader worker forked from a `run` inherits the handler: SIGTERM ends it as it ends a plain worker,
    instead of raising the run's exception in it."""
    import os
    import time

    from loaderdoctor.tap.signals import SignalRaises

    with SignalRaises(signal.SIGUSR2, _Stop) as raises:
        child = os.fork()
        if child == 0:
            try:
                os.kill(os.getpid(), signal.SIGUSR2)
                time.sleep(5)
            finally:
                os._exit(7)  # only if the signal did not end it
        _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGUSR2, status
    assert raises.received is None


@pytest.fixture
def sigint():
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_pressed_three_times_fast_is_one_press_and_one_after_a_pause_raises_again(sigint, monkeypatch):
    from loaderdoctor.tap import signals

    monkeypatch.setattr(signals, "_stops", {})
    clock = [100.0]
    monkeypatch.setattr(signals.time, "monotonic", lambda: clock[0])
    presses = signals.SignalRaises(signal.SIGINT, lambda signum: KeyboardInterrupt(), burst_s=1.0)
    with presses:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # Python's own handler counts as none: this one takes its place
        for _ in range(2):  # the rest of the burst, 20 ms apart: the clean-up it started is not cut short
            clock[0] += 0.02
            signal.raise_signal(signal.SIGINT)
        clock[0] += 1.5  # a press after a pause: the user insists
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        presses.settle()  # taken as the end of what it stopped: the rest of this burst is absorbed too
        clock[0] += 0.5
        signal.raise_signal(signal.SIGINT)
        clock[0] += 1.5  # the burst is over: uninstalling does not wait for its rest
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signals.stopped_with_job(signal.SIGINT, at=clock[0] - 1.5)  # noted as the job's stop signal
    assert not signals.stopped_with_job(signal.SIGINT, at=clock[0] + signals.SAME_STOP_S + 1)


def test_a_loader_started_after_sigterm_raises_the_stop_again_but_not_after_ctrl_c(sigint, monkeypatch):
    from loaderdoctor.tap import signals

    monkeypatch.setattr(signals, "_stops", {})
    before = signal.getsignal(signal.SIGTERM)

    class Stopped(BaseException):
        pass

    term = signals.SignalRaises(signal.SIGTERM, lambda signum: Stopped())
    presses = signals.SignalRaises(signal.SIGINT, lambda signum: KeyboardInterrupt())
    with term, presses:
        signals.raise_if_stopping()  # nothing came: nothing raised
        monkeypatch.setattr(signals, "WATCH_EVERY_S", 30.0)  # its watcher sends it again only once the test is over
        monkeypatch.setattr(signals, "_in_standard_library", lambda frame: True)
        signal.raise_signal(signal.SIGINT)  # held back: it came in the standard library's code
        monkeypatch.setattr(signals, "_in_standard_library", lambda frame: False)
        with pytest.raises(KeyboardInterrupt):  # raised where workers would start, before any does
            signals.raise_if_stopping()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signals.raise_if_stopping()  # Ctrl-C may be caught to go on: no stop
        with pytest.raises(Stopped):
            signal.raise_signal(signal.SIGTERM)
        with pytest.raises(Stopped):  # caught by the program, and raised again where workers would start
            signals.raise_if_stopping()
    signals.raise_if_stopping()  # uninstalled: the job it stopped is over
    assert signal.getsignal(signal.SIGTERM) is before


def test_uninstalling_waits_out_a_burst_under_way_so_that_its_rest_reaches_no_handler_put_back(sigint, monkeypatch):
    import threading
    import time

    from loaderdoctor.tap import signals

    monkeypatch.setattr(signals, "_stops", {})
    presses = signals.SignalRaises(signal.SIGINT, lambda signum: KeyboardInterrupt(), burst_s=0.3)
    main = threading.main_thread().ident
    presses.install()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    later = threading.Timer(0.1, lambda: signal.pthread_kill(main, signal.SIGINT))  # the burst's last press
    later.start()
    started = time.monotonic()
    presses.uninstall()  # absorbs it, then puts Python's handler back
    later.join()
    assert 0.3 <= time.monotonic() - started < 2.0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_stop_signal_waits_while_torchs_iterator_is_being_made():
    import sys

    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from loaderdoctor.tap.signals import _making_an_iterator

    seen = {}

    class Making(_BaseDataLoaderIter):
        def __init__(self) -> None:  # torch's own sets its attributes here; a signal now would leave half of them
            seen["inside"] = _making_an_iterator(sys._getframe())

    Making()
    assert seen["inside"] is True
    assert _making_an_iterator(sys._getframe()) is False
