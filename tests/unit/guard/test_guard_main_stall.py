"""A guarded loader without workers whose next() stalls in the main thread is interrupted instead of hanging.
Here the dataset cannot be pickled for a spawned worker (tests/integration/test_guard_faults.py has the one
that moves to a worker): loading resumes in the main process at the batch not yet delivered, up to max_restarts
times, and then gives up with an error naming where it is stuck."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.guard import guard
from loaderdoctor.loader.settings import Settings
from loaderdoctor.tap.interrupt import INTERRUPT_SIGNAL

_STUCK_INDEX = 6


class BlocksAt(Dataset):
    """Blocks forever at one index, until the test sets `release` (an Event: it cannot be pickled)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __len__(self) -> int:
        return 21

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == _STUCK_INDEX:
            self.release.wait()  # the line the stall is reported at
        return torch.tensor(index)


class HangsOnceAt(Dataset):
    """Blocks forever the first time it loads one index; holds a lock, so it cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hung = False

    def __len__(self) -> int:
        return 21

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == _STUCK_INDEX and not self.hung:
            self.hung = True
            threading.Event().wait()
        return torch.tensor(index)


class HangsAt(Dataset):
    """Blocks forever at one index, every time; it could be pickled for a worker."""

    def __len__(self) -> int:
        return 21

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == _STUCK_INDEX:
            threading.Event().wait()
        return torch.tensor(index)


def _stuck_line() -> int:
    with open(BlocksAt.__getitem__.__code__.co_filename) as source:
        return next(n for n, text in enumerate(source, 1) if "self.release.wait()  #" in text)


@pytest.mark.timeout(30)
def test_a_main_thread_stall_without_restarts_left_is_interrupted_and_gives_up_naming_the_stuck_line():
    dataset = BlocksAt()
    started = time.monotonic()
    try:
        with guard(DataLoader(dataset, batch_size=4), stall_timeout=1, max_restarts=0) as guarded:
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
    assert "no workers (main process)" in message
    (stall,) = [e for e in events if e.kind == "stall"]
    assert stall.batch == 1 and stall.detail["pids"] == []
    assert "interrupting it" in stall.message


@pytest.mark.timeout(30)
def test_an_interrupted_stall_resumes_in_the_main_process_when_the_dataset_cannot_go_to_a_worker():
    with guard(DataLoader(HangsOnceAt(), batch_size=4), stall_timeout=1) as guarded:
        delivered = [i for batch in guarded for i in batch.tolist()]
        events = list(guarded.events)
    assert delivered == list(range(21))
    assert [e.kind for e in events] == ["stall", "restart"]
    restart = events[1]
    assert restart.batch == 1 and restart.detail["resume_at"] == 1 and not restart.detail["escalated"]
    assert restart.detail["after"] == restart.detail["before"] == Settings().to_dict()
    assert "again with no workers (main process)" in restart.message
    assert "cannot be sent to a worker process" in restart.message


@pytest.mark.timeout(30)
def test_a_stall_that_comes_back_in_the_main_process_gives_up_after_max_restarts():
    dataset = BlocksAt()
    try:
        with guard(DataLoader(dataset, batch_size=4), stall_timeout=1, max_restarts=2) as guarded:
            delivered = []
            with pytest.raises(LoaderDoctorError) as raised:
                for batch in guarded:
                    delivered.extend(batch.tolist())
            events = list(guarded.events)
    finally:
        dataset.release.set()
    assert delivered == [0, 1, 2, 3]
    assert [e.kind for e in events] == ["stall", "restart", "stall", "restart", "stall"]
    assert "gave up at epoch 0, batch 1 of 6: a stall, after 2 restarts (max_restarts=2)" in raised.value.message
    assert f"test_guard_main_stall.py:{_stuck_line()} in __getitem__" in raised.value.message


@pytest.mark.timeout(30)
def test_a_loader_that_came_down_through_a_single_spawned_worker_does_not_go_back_up_to_one():
    with guard(DataLoader(HangsAt(), batch_size=4), stall_timeout=1) as guarded:
        # As if the ladder had come down to the main process through it (tests/integration has the way up).
        guarded.tried.append(Settings(num_workers=1, start_method="spawn", persistent_workers=True))
        delivered = []
        with pytest.raises(LoaderDoctorError, match="after 0 restarts "):
            for batch in guarded:
                delivered.extend(batch.tolist())
        assert [e.kind for e in guarded.events] == ["stall"] and delivered == [0, 1, 2, 3]


class SignalsDuring(Dataset):
    """Sends this process a SIGUSR2 (as a scheduler warns of preemption) while one sample loads."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 5:
            signal.raise_signal(INTERRUPT_SIGNAL)
        return index


@pytest.mark.timeout(30)
def test_the_users_sigusr2_handler_runs_during_and_after_a_guarded_loop():
    received = []
    users = signal.signal(INTERRUPT_SIGNAL, lambda signum, frame: received.append(signum))
    try:
        handler = signal.getsignal(INTERRUPT_SIGNAL)
        with guard(DataLoader(SignalsDuring(), batch_size=4), stall_timeout=5) as guarded:
            assert [b.tolist() for b in guarded] == [[0, 1, 2, 3], [4, 5, 6, 7]]
            assert received == [INTERRUPT_SIGNAL]  # passed on from the guard's handler, in next()
            assert signal.getsignal(INTERRUPT_SIGNAL) is handler  # once the epoch ended: the user's again
        signal.raise_signal(INTERRUPT_SIGNAL)
        assert received == [INTERRUPT_SIGNAL] * 2 and signal.getsignal(INTERRUPT_SIGNAL) is handler
    finally:
        signal.signal(INTERRUPT_SIGNAL, users)
