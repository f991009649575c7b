"""The guarded loader without worker processes: same batches and len() as the plain one, options checked,
errors of the dataset passed through; and the SIGCHLD handler's decisions."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.errors import UsageError
from loaderdoctor.guard import DataLoader as GuardedDataLoader
from loaderdoctor.guard import children, guard
from loaderdoctor.guard.loader import stall_policy
from loaderdoctor.tap.iterator import is_worker_death
from loaderdoctor.tap.watchdog import StallPolicy
from loaderdoctor.workers.processes import exited_workers
from shared_datasets import Pairs, Stream


class RaisesAt(Pairs):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == 5:
            raise ValueError("sample 5 is broken")
        return super().__getitem__(index)


class SlowOnceAt(Pairs):
    """Sleeps at one index the first time: a main-process stall that ends by itself."""

    def __init__(self) -> None:
        super().__init__(21)
        self.slept = False

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == 6 and not self.slept:
            self.slept = True
            time.sleep(1.6)  # the line the stall is reported at
        return super().__getitem__(index)


def _loader(dataset: Dataset | None = None, seed: int = 4, **kwargs) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset or Pairs(21), batch_size=4, shuffle=True, generator=generator, **kwargs)


def _same(a, b) -> bool:
    return all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True))


def test_without_faults_the_guarded_loader_yields_what_the_plain_one_does():
    plain = _loader()
    expected = [list(plain) for _ in range(3)]
    with guard(_loader()) as guarded:
        got = [list(guarded) for _ in range(3)]
        assert guarded.events == [] and guarded.restarts == 0
    assert all(_same(g, e) for g, e in zip(got, expected, strict=True))


def test_len_and_the_loaders_attributes_are_the_users():
    user = _loader(drop_last=True)
    with guard(user) as guarded:
        assert len(guarded) == len(user) == 5
        assert guarded.dataset is user.dataset and guarded.batch_size == 4 and guarded.sampler is user.sampler


def test_the_drop_in_dataloader_takes_the_same_arguments():
    with GuardedDataLoader(Pairs(21), batch_size=5, stall_timeout=3.0, max_restarts=1) as guarded:
        batches = list(guarded)
        assert [b[1].tolist() for b in batches] == [list(range(i, min(i + 5, 21))) for i in range(0, 21, 5)]
        assert guarded.policy.floor_s == 3.0 and guarded.max_restarts == 1


def test_iter_and_next_work_as_with_a_plain_loader():
    with guard(DataLoader(Pairs(21), batch_size=None)) as g:
        iterator = iter(g)
        first = next(iterator)
        assert first[1] == 0 and torch.equal(first[0], torch.zeros(3))
        assert len(list(iterator)) == 20
        with pytest.raises(StopIteration):
            next(iterator)


def test_a_new_epoch_ends_the_iterator_of_the_one_before():
    with guard(_loader()) as guarded:
        old = iter(guarded)
        next(old)
        new = iter(guarded)
        assert len(list(new)) == 6
        with pytest.raises(UsageError, match="ended by iter\\(\\) of epoch 1"):
            next(old)


def test_a_dataset_error_reaches_the_user_and_the_epoch_goes_on():
    plain = DataLoader(RaisesAt(21), batch_size=4)
    with guard(DataLoader(RaisesAt(21), batch_size=4)) as guarded:
        iterator, expected = iter(guarded), iter(plain)
        assert next(iterator)[1].tolist() == next(expected)[1].tolist() == [0, 1, 2, 3]
        with pytest.raises(ValueError, match="sample 5 is broken"):
            next(iterator)
        assert [b[1].tolist() for b in iterator] == [[8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19], [20]]
        assert guarded.events == []


def test_a_main_process_stall_outside_the_main_thread_is_recorded_with_its_stack_and_waited_out(caplog):
    caplog.set_level(logging.WARNING, logger="loaderdoctor")
    batches = []

    def consume() -> None:
        # No signal reaches a thread other than the main one: the guard can only record the stall.
        with guard(DataLoader(SlowOnceAt(), batch_size=4), stall_timeout=StallPolicy(floor_s=0.5)) as guarded:
            batches.extend(guarded)
            events.extend(guarded.events)

    events = []
    consumer = threading.Thread(target=consume)
    consumer.start()
    consumer.join()
    (stall,) = events
    assert [i for b in batches for i in b[1].tolist()] == list(range(21))
    assert stall.kind == "stall" and stall.batch == 1 and stall.detail["pids"] == []
    assert stall.detail["stacks"][0]["stuck_frame"].endswith("in __getitem__")
    assert "cannot interrupt it, so it waits on" in stall.message
    assert any("stall at epoch 0, batch 1" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"stall_timeout": 0}, "stall_timeout must be a number of seconds above 0"),
        ({"stall_timeout": "5"}, "stall_timeout must be"),
        ({"max_restarts": -1}, "max_restarts must be a whole number, 0 or more, not -1"),
        ({"max_restarts": 1.5}, "max_restarts must be"),
    ],
)
def test_bad_options_are_usage_errors(options, words):
    with pytest.raises(UsageError, match=words):
        guard(_loader(), **options)


def test_only_dataloaders_of_datasets_the_guard_can_resume_are_guarded():
    with pytest.raises(UsageError, match=r"expects a torch\.utils\.data\.DataLoader, got builtins\.list"):
        guard([1, 2, 3])
    # An IterableDataset without state_dict()/load_state_dict(): tests/unit/guard/test_streams.py has those with.
    with pytest.raises(UsageError, match="cannot resume the IterableDataset Stream: without state_dict"):
        guard(DataLoader(Stream(3)))


def test_stall_timeout_sets_both_deadlines_or_the_whole_policy():
    assert stall_policy(None) == StallPolicy()
    assert stall_policy(2) == StallPolicy(floor_s=2.0, first_batch_s=2.0)
    policy = StallPolicy(floor_s=1.0, first_batch_s=30.0)
    assert stall_policy(policy) is policy


def test_persistent_workers_are_turned_on_and_said_once(caplog):
    caplog.set_level(logging.INFO, logger="loaderdoctor")
    with guard(_loader(num_workers=2)) as guarded:  # not iterated: no worker starts
        (event,) = guarded.events
        assert event.kind == "setting-changed" and event.detail["setting"] == "persistent_workers"
        assert guarded.settings.persistent_workers
    assert sum("persistent_workers False -> True" in r.getMessage() for r in caplog.records) == 1
    with GuardedDataLoader(Pairs(21), batch_size=4, num_workers=2, persistent_workers=False) as kept:
        assert kept.events == [] and not kept.settings.persistent_workers


# The SIGCHLD handler, driven by hand: torch's handler is a function that raises what torch would.


class _Owner:
    def __init__(self) -> None:
        self.died: str | None = None
        self.interrupt_requested = False


def _torch_says(message: str):
    def handler(signum, frame):
        raise RuntimeError(message)

    return handler


@pytest.fixture
def ended_children():
    """Two children that have ended, not reaped (as torch's handler sees them): one killed, one exited with 0."""
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    clean = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for child in (killed, clean):
            while os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                time.sleep(0.01)
        yield killed.pid, clean.pid
    finally:
        killed.wait()
        clean.wait()


@pytest.fixture
def handler_state(monkeypatch):
    monkeypatch.setattr(children, "_owners", {})
    monkeypatch.setattr(children, "_armed", None)
    return children


@pytest.mark.workers
def test_a_guarded_workers_death_outside_next_is_kept_for_later(handler_state, ended_children):
    killed, _ = ended_children
    owner = _Owner()
    children.watch([killed], owner)
    previous = _torch_says("torch's words, whatever they are")
    children._on_sigchld(17, None, previous)  # no raise: the user's code is running
    assert owner.died == "torch's words, whatever they are"


@pytest.mark.workers
def test_a_guarded_workers_death_inside_its_next_raises_there(handler_state, ended_children):
    killed, _ = ended_children
    owner = _Owner()
    children.watch([killed], owner)
    children._armed = owner
    previous = _torch_says("DataLoader worker is killed by signal: Segmentation fault. ")
    with pytest.raises(RuntimeError, match="Segmentation fault"):
        children._on_sigchld(17, None, previous)


@pytest.mark.workers
def test_another_loaders_worker_death_raises_as_before(handler_state, ended_children):
    # The guarded worker ended cleanly (exit status 0, as at shutdown): the death torch reports is not its.
    _, clean = ended_children
    owner = _Owner()
    children.watch([clean, 99_999_999], owner)
    previous = _torch_says(f"DataLoader worker (pid {clean}) is killed by signal: Killed. ")
    with pytest.raises(RuntimeError, match="Killed"):
        children._on_sigchld(17, None, previous)
    assert owner.died is None


def test_an_interrupt_ends_only_the_armed_next(handler_state):
    owner = _Owner()
    owner.interrupt_requested = True
    children._on_sigchld(17, None, None)  # not armed: nothing
    children._armed = owner
    with pytest.raises(children.GuardInterrupt):
        children._on_sigchld(17, None, None)
    assert not owner.interrupt_requested
    children._on_sigchld(17, None, None)  # once


@pytest.mark.workers
@pytest.mark.timeout(60)
def test_a_workers_death_is_known_from_its_process_not_from_words():
    loader = DataLoader(Pairs(21), batch_size=4, num_workers=1, multiprocessing_context="fork")
    iterator = iter(loader)
    torchs_handler = None
    try:
        next(iterator)
        assert exited_workers(iterator) == []
        assert not is_worker_death(RuntimeError("DataLoader worker (pid 9) is killed by signal: Killed."), iterator)
        (pid,) = [w.pid for w in iterator._workers]
        # Killed while it holds a lock of the iterator's (its done event's, read after each task), the worker
        # would leave _shutdown_workers() waiting for ever: kill it once its prefetched tasks are done.
        time.sleep(0.5)
        # torch's SIGCHLD handler would report the death wherever the main thread is, in this test's own lines
        # too: it is set aside until the workers are shut down.
        torchs_handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.kill(pid, signal.SIGKILL)
        assert exited_workers(iterator, grace_s=10.0) == [pid]
        assert is_worker_death(RuntimeError("any words at all"), iterator)
        assert is_worker_death(ConnectionResetError(104, "Connection reset by peer"), iterator)  # what it broke
        try:  # a dataset's error, as torch re-raises it from a worker, is no death even while one has ended
            raise ValueError("a dataset's error")
        except ValueError:
            wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
        try:
            wrapper.reraise()
        except ValueError as error:
            assert not is_worker_death(error, iterator)
    finally:
        iterator._shutdown_workers()
        if torchs_handler is not None:
            signal.signal(signal.SIGCHLD, torchs_handler)


def test_setting_the_loaders_attributes_behaves_as_with_torch():
    plain, guarded = DataLoader(Pairs(21), batch_size=4), GuardedDataLoader(Pairs(21), batch_size=4)

    def indices(samples: list) -> list:
        return [index for _, index in samples]

    for loader in (plain, guarded):
        with pytest.raises(ValueError, match="batch_size attribute should not be set after DataLoader is initialized"):
            loader.batch_size = 2
        iterator = iter(loader)
        loader.collate_fn = indices  # from the next iter() on
        assert torch.equal(next(iterator)[1], torch.tensor([0, 1, 2, 3])) and loader.collate_fn is indices
        assert next(iter(loader)) == [0, 1, 2, 3]
    guarded.timeout = 7  # read back, and the user's deadline from the next iter() on
    assert guarded.loader.timeout == 7 and guarded.timeout == 7
    iter(guarded)
    assert guarded.policy.floor_s == 2 * 7 + 5.0
    guarded.close()


class CtrlCOnceAt(Pairs):
    """Ctrl-C pressed while sample 5 loads (in a notebook: the cell stops, the loader is kept)."""

    def __init__(self) -> None:
        super().__init__(21)
        self.pressed = False

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == 5 and not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt
        return super().__getitem__(index)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("at_first_batch", [False, True])
def test_ctrl_c_in_next_ends_the_wait_no_stall_follows_and_iteration_goes_on(at_first_batch):
    dataset = CtrlCOnceAt()
    with guard(DataLoader(dataset, batch_size=4 if not at_first_batch else 6), stall_timeout=1.0) as guarded:
        iterator = iter(guarded)
        if not at_first_batch:
            next(iterator)
        with pytest.raises(KeyboardInterrupt):
            next(iterator)
        time.sleep(2.0)  # the user looks around, longer than the 1 s deadline
        rest = [b[1].tolist() for b in iterator]
        assert guarded.events == [] and guarded.restarts == 0
        size = 6 if at_first_batch else 4
        first = 0 if at_first_batch else 4
        assert rest == [list(range(i, min(i + size, 21))) for i in range(first, 21, size)]  # no batch lost
        again = [b[1].tolist() for b in guarded]  # the next iter() works
        assert again[0][0] == 0 and again[-1][-1] == 20
