"""A next() that raises is said in one BatchFailed event before the error goes on, even when torch's SIGCHLD
handler raises a worker's death in the middle of the saying (it runs wherever the main thread is)."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from loaderdoctor.tap.events import BatchFailed
from loaderdoctor.tap.iterator import Tap

DEATH = "DataLoader worker (pid 1715) is killed by signal: Segmentation fault."


class BrokenIterator:
    """What a worker's death leaves next(): the batch's shared memory cannot be fetched from it, and the signal of
    the death (`deaths` of them) came meanwhile, its handler to run at the main thread's next call."""

    def __init__(self, clock: ClockWithPendingHandler, deaths: int) -> None:
        self.clock, self.deaths = clock, deaths

    def __next__(self):
        self.clock.pending = self.deaths
        raise ConnectionResetError(104, "Connection reset by peer")


class ClockWithPendingHandler:
    """A clock whose next `pending` reads raise torch's RuntimeError, as its SIGCHLD handler does at the first
    call the main thread makes once the signal has come."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pending = 0

    def __call__(self) -> float:
        if self.pending:
            self.pending -= 1
            raise RuntimeError(DEATH)
        self.now += 0.01
        return self.now


def _tapped(listeners: list, clock: ClockWithPendingHandler, deaths: int = 0) -> Tap:
    loader = DataLoader(list(range(8)), batch_size=2)
    broken = BrokenIterator(clock, deaths)
    return Tap(loader, listeners, start_method=None, clock=clock, open_iterator=lambda loader: broken)


@pytest.mark.parametrize("deaths", [1, 2])
def test_a_death_raised_while_the_failure_is_said_is_said_and_raised(deaths):
    events, clock = [], ClockWithPendingHandler()
    iterator = _tapped([events.append], clock, deaths).epoch(0)  # or a second worker's death too
    with pytest.raises(RuntimeError, match="killed by signal") as raised:
        next(iterator)
    assert isinstance(raised.value.__context__, ConnectionResetError | RuntimeError)
    (failed,) = [e for e in events if isinstance(e, BatchFailed)]
    assert isinstance(failed.error, RuntimeError) and failed.index == 0
    assert iterator.index == 1 and iterator.waiting_since is None


def test_a_failure_said_without_interruption_raises_the_loaders_own_error():
    events, clock = [], ClockWithPendingHandler()
    iterator = _tapped([events.append], clock).epoch(0)
    with pytest.raises(ConnectionResetError):
        next(iterator)
    (failed,) = [e for e in events if isinstance(e, BatchFailed)]
    assert isinstance(failed.error, ConnectionResetError)


def test_a_death_raised_in_a_listener_is_raised_without_saying_the_failure_again():
    events, clock = [], ClockWithPendingHandler()

    def listener(event) -> None:
        events.append(event)
        if isinstance(event, BatchFailed):
            raise RuntimeError(DEATH)  # the handler ran inside the listener, which records a death itself

    iterator = _tapped([listener], clock).epoch(0)
    with pytest.raises(RuntimeError, match="killed by signal"):
        next(iterator)
    assert [type(e.error) for e in events if isinstance(e, BatchFailed)] == [ConnectionResetError]
    assert iterator.index == 1
