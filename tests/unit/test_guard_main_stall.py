"""A guarded loader without workers whose next() stalls in the main thread is interrupted and gives up with an
error naming where it is stuck, instead of hanging."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.guard import guard
from loaderdoctor.interrupt import INTERRUPT_SIGNAL

_STUCK_INDEX = 6


class BlocksAt(Dataset):
    """Blocks forever at one index, until the test sets `release`."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __len__(self) -> int:
        return 21

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == _STUCK_INDEX:
            self.release.wait()  # the line the stall is reported at
        return torch.tensor(index)


def _stuck_line() -> int:
    with open(BlocksAt.__getitem__.__code__.co_filename) as source:
        return next(n for n, text in enumerate(source, 1) if "self.release.wait()  #" in text)


@pytest.mark.timeout(30)
def test_a_main_thread_stall_without_workers_is_interrupted_and_gives_up_naming_the_stuck_line():
    dataset = BlocksAt()
    started = time.monotonic()
    try:
        with guard(DataLoader(dataset, batch_size=4), stall_timeout=1) as guarded:
            delivered = []
            with pytest.raises(LoaderDoctorError) as raised:
                for batch in guarded:
                    delivered.extend(batch.tolist())
            events = list(guarded.events)
    finally:
        dataset.release.set()
    assert time.monotonic() - started < 10
    assert delivered == [0, 1, 2, 3]
    message = str(raised.value)
    assert "epoch 0, batch 1" in message
    assert f"test_guard_main_stall.py:{_stuck_line()} in __getitem__" in message
    assert "num_workers=0 (loading in the main process)" in message
    (stall,) = [e for e in events if e.kind == "stall"]
    assert stall.batch == 1 and stall.detail["pids"] == []
    assert "interrupting it" in stall.message


@pytest.mark.timeout(30)
def test_the_kept_handler_ignores_the_signal_outside_the_guards_next():
    with guard(DataLoader(BlocksAt(), batch_size=4), stall_timeout=5) as guarded:
        first = next(iter(guarded))
    signal.pthread_kill(threading.main_thread().ident or 0, INTERRUPT_SIGNAL)  # not armed: nothing is raised
    assert first.tolist() == [0, 1, 2, 3]
