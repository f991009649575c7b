"""The main thread's interrupter (tap/interrupt.py) says why it cannot end a stuck wait: not another handler of
SIGUSR2 when none replaced it, but a wait outside next(), which alone it ends."""

from __future__ import annotations

import signal

from loaderdoctor.tap.interrupt import INTERRUPT_SIGNAL, MainThreadInterrupter


def test_a_wait_outside_next_is_said_as_such_and_another_handler_only_when_there_is_one():
    with MainThreadInterrupter() as interrupter:
        assert not interrupter.interrupt()  # installed, not armed: the main thread is not in next()
        assert interrupter.why_not().startswith("the stuck wait is not inside next()")
        theirs = signal.signal(INTERRUPT_SIGNAL, lambda signum, frame: None)  # the user's, set since
        try:
            interrupter.armed = True
            assert not interrupter.interrupt()
            assert interrupter.why_not() == "SIGUSR2 has another handler now: the stuck next() cannot be interrupted"
        finally:
            interrupter.armed = False
            signal.signal(INTERRUPT_SIGNAL, theirs)
