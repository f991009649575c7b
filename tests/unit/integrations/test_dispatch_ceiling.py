"""DispatcherTurns on a stand-in for accelerate's DataLoaderDispatcher (a class whose __iter__ is a generator of the
batches it would broadcast): while installed, the chosen dispatcher's epochs go through the turns, each data-free
step handed without asking the dispatcher, and the real stream goes on after; any other dispatcher of the class
iterates as before; restore() puts the class back, and leaves a hook installed since in place; the hook goes with
the dispatcher when nothing restored it."""

from __future__ import annotations

import gc

from torch.utils.data import DataLoader

from loaderdoctor.integrations.accelerate import DispatcherTurns
from loaderdoctor.integrations.trainer.ceiling import TrainerCeiling


class Dispatcher:
    """Batches 0, 1, 2... in order, counting how many it was asked for (each would be a broadcast)."""

    def __init__(self) -> None:
        self.asked = 0

    def __iter__(self):
        for batch in range(100):
            self.asked += 1
            yield batch


class Accelerated(Dispatcher):  # its __iter__ is the parent class's, as accelerate's subclasses are
    pass


def _ceiling() -> TrainerCeiling:
    # 9 data-free steps: after 6 deliveries, real turns of 5 and data-free turns of 3.
    return TrainerCeiling(DataLoader(list(range(10)), batch_size=None), 9, stop_when_done=False)


def test_the_chosen_dispatchers_epochs_go_through_the_turns_without_asking_it_at_data_free_steps():
    chosen, other = Accelerated(), Accelerated()
    ceiling = _ceiling()
    turns = DispatcherTurns(chosen, ceiling)
    try:
        assert Dispatcher.__dict__["__iter__"] is turns.hook and "__iter__" not in Accelerated.__dict__
        got = [batch for _, batch in zip(range(40), chosen, strict=False)]
        assert list(other)[:5] == [0, 1, 2, 3, 4]  # another dispatcher of the class iterates as before
    finally:
        turns.restore()

    free = [n for n in range(40) if ceiling.turns.kind_at(n) == "data-free"]
    assert free == [11, 12, 13, 19, 20, 21, 27, 28, 29]
    expected, real = [], iter(range(100))
    for n in range(40):
        expected.append(expected[-1] if n in free else next(real))
    assert got == expected  # each data-free step is the last real batch again; the real stream goes on after
    assert chosen.asked == 40 - 9  # never asked at a data-free step
    assert ceiling.stepped(40) == 9
    assert Dispatcher.__dict__["__iter__"] is turns.original  # put back
    assert list(chosen)[:3] == [0, 1, 2]


def test_a_hook_installed_since_stays_and_passes_everything_through():
    chosen = Dispatcher()
    turns = DispatcherTurns(chosen, _ceiling())
    hooked = Dispatcher.__dict__["__iter__"]

    def later(loader):  # somebody else's hook over ours
        return hooked(loader)

    Dispatcher.__iter__ = later
    try:
        turns.restore()
        assert Dispatcher.__dict__["__iter__"] is later
        assert list(chosen)[:12] == list(range(12))  # ours passes everything through once restored
    finally:
        Dispatcher.__iter__ = turns.original


def test_the_hook_goes_with_the_dispatcher_when_nothing_restored_it():
    chosen = Dispatcher()
    turns = DispatcherTurns(chosen, _ceiling())
    assert Dispatcher.__dict__["__iter__"] is turns.hook
    del chosen  # a train() that raised: its callback never restored the hook
    gc.collect()
    assert Dispatcher.__dict__["__iter__"] is turns.original
