"""The probe against real worker processes: pids, samples, a stall with its stack, a killed worker."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.signal_handling import _error_if_any_worker_fails

from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.probe.measure import probe
from loaderdoctor.probe.measuring import Measuring
from loaderdoctor.probe.session import ProbeSession
from loaderdoctor.tap.watchdog import StallPolicy
from shared_datasets import Squares

pytestmark = [pytest.mark.workers, pytest.mark.timeout(90)]

# Short deadlines so a stall is declared in seconds; the hangs planted below are forever, so no margin is lost.
QUICK = StallPolicy(floor_s=2.0, multiple=20.0, first_batch_s=20.0, first_batch_idle_s=2.0, idle_window_s=1.0)

_LOCK = threading.Lock()


class NeedsTheLock(Squares):
    def __init__(self) -> None:
        super().__init__(64, width=16)

    def __getitem__(self, index: int) -> torch.Tensor:
        with _LOCK:  # the line a stuck worker is reported at
            return super().__getitem__(index)


class KillsItselfAt(Squares):
    def __init__(self, index: int) -> None:
        super().__init__(64, width=16)
        self.fatal = index

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.fatal:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


class _LockHolder:
    """A parent thread that holds _LOCK while workers fork, as a metrics or logging client might."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        held = threading.Event()

        def hold() -> None:
            with _LOCK:
                held.set()
                self.stop.wait()

        self.thread = threading.Thread(target=hold, name="lock-holder")
        self.thread.start()
        held.wait()

    def release(self) -> None:
        self.stop.set()
        self.thread.join()


@pytest.fixture
def lock_held():
    holder = _LockHolder()
    yield holder
    holder.release()


def _spec(dataset: Dataset, **loader_kwargs) -> LoaderSpec:
    return LoaderSpec.from_loader(DataLoader(dataset, batch_size=8, **loader_kwargs))


def test_persistent_workers_keep_their_pids_and_are_sampled():
    rec = probe(_spec(Squares(64, width=16), num_workers=2, persistent_workers=True), budget_s=20, epochs=3, step_ms=20)
    assert rec.outcome == "completed"
    assert [e.batches for e in rec.epochs] == [8, 8, 8]
    pid_sets = {frozenset(e.worker_pids) for e in rec.epochs}
    assert len(pid_sets) == 1 and len(next(iter(pid_sets))) == 2
    sampled = {s.pid for s in rec.worker_samples}
    assert sampled and sampled <= next(iter(pid_sets))
    assert all(s.threads >= 1 and s.rss_bytes > 0 for s in rec.worker_samples)
    private = [s.uss_bytes for s in rec.worker_samples if s.uss_bytes is not None]  # the CPU only at the edges
    assert private and all(uss > 0 for uss in private)


def test_workers_that_are_not_persistent_change_pids_every_epoch():
    rec = probe(_spec(Squares(64, width=16), num_workers=2), budget_s=20, epochs=3)
    pids = [frozenset(e.worker_pids) for e in rec.epochs]
    assert len(pids) == 3 and len(set(pids)) == 3
    assert all(e.first_batch_s is not None and e.first_batch_s > 0 for e in rec.epochs)
    # Each epoch's iter() started its workers: time spent in iter() itself, within the first batch's.
    assert all(0 < e.iter_s <= e.first_batch_s for e in rec.epochs)


def test_a_worker_stuck_on_a_lock_copied_by_fork_is_a_stall_with_its_stack(lock_held):
    started = time.monotonic()
    rec = probe(
        _spec(NeedsTheLock(), num_workers=2, multiprocessing_context="fork"),
        budget_s=30,
        epochs=2,
        policy=QUICK,
    )
    assert time.monotonic() - started < 20
    assert rec.outcome == "stalled" and rec.stall is not None
    assert rec.stall.batch == 0 and rec.stall.workers_cpu_idle is True
    assert [t.name for t in rec.iterators[0].threads] == ["lock-holder"]
    assert rec.iterators[0].threads[0].runs.endswith("in hold")  # where it runs, for the report
    stuck = {str(s.stuck_frame) for s in rec.stall.stacks}
    expected_line = _line_of("with _LOCK:  # the line a stuck worker is reported at")
    assert stuck == {f"{__file__}:{expected_line} in __getitem__"}
    assert len(rec.stall.stacks) == 2


def test_forkserver_workers_do_not_inherit_the_held_lock(lock_held):
    spec = _spec(NeedsTheLock(), num_workers=2, multiprocessing_context="fork")
    rec = probe(spec, Settings(num_workers=2, start_method="forkserver"), budget_s=30, epochs=1, policy=QUICK)
    assert rec.outcome == "completed" and len(rec.batches) == 8


def test_loading_stuck_in_the_main_process_is_interrupted(lock_held):
    policy = StallPolicy(first_batch_s=2.0)
    started = time.monotonic()
    rec = probe(_spec(NeedsTheLock()), budget_s=30, epochs=1, policy=policy)
    assert time.monotonic() - started < 15
    assert rec.outcome == "stalled"
    (stack,) = rec.stall.stacks
    assert stack.pid == os.getpid()
    assert stack.stuck_frame is not None and stack.stuck_frame.function == "__getitem__"


@pytest.mark.parametrize("persistent", [False, True])
def test_a_killed_worker_ends_the_run_as_crashed(persistent):
    rec = probe(
        _spec(KillsItselfAt(20), num_workers=2, persistent_workers=persistent),
        budget_s=30,
        epochs=2,
        policy=QUICK,
    )
    assert rec.outcome == "crashed"
    (death,) = rec.worker_deaths
    # torch's RuntimeError, or what the death broke: a batch's shared memory handed over by the dying worker
    # (ConnectionResetError, seen beside another test's load)
    assert any(words in death.message for words in ("killed by signal", "exited unexpectedly", "Connection reset"))


def test_errors_in_workers_name_the_sample_index():
    class_ = _RaisesAt
    rec = probe(_spec(class_({3, 40}), num_workers=2, persistent_workers=True), budget_s=20, epochs=1)
    assert rec.outcome == "completed"
    assert sorted(e.index for e in rec.sample_errors) == [3, 40]
    assert {e.error_type for e in rec.sample_errors} == {"ValueError"}
    assert len(rec.batches) == 6  # 8 batches, 2 lost


class _RaisesAt(Squares):
    def __init__(self, bad: set[int]) -> None:
        super().__init__(64, width=16)
        self.bad = bad

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in self.bad:
            raise ValueError(f"corrupt record {index}")
        return super().__getitem__(index)


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(number for number, line in enumerate(source, 1) if text in line and "_line_of" not in line)


def test_a_death_torch_raises_between_batches_is_the_runs_outcome_not_an_error():
    # torch's SIGCHLD handler raises a worker's death wherever the main thread is: here, as a window opens (its
    # first CPU sample), which a benchmark's tuner trial met after the watchdog killed stalled workers.
    spec = _spec(Squares(64, width=16), num_workers=1, persistent_workers=True)
    session = ProbeSession(Measuring(spec, policy=QUICK), spec.settings)
    try:
        assert session.start(startup_limit_s=30)
        (pid,) = session.current_pids()
        torchs_handler = signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # raised below, where the test chooses
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            poll_once = session.poller.poll_once

            def sample_then_torchs_handler(**kinds: bool) -> None:
                poll_once(**kinds)
                # what torch's SIGCHLD handler does (called by itself: an earlier test in this process may have
                # left another handler in its place, and torch installs its own once per process)
                _error_if_any_worker_fails()

            session.poller.poll_once = sample_then_torchs_handler
            assert session.run(2.0) is not None  # the window that ended at once, not an exception
        finally:
            signal.signal(signal.SIGCHLD, torchs_handler)
    finally:
        rec = session.close()
    assert rec.outcome == "crashed"
    (death,) = rec.worker_deaths
    assert "killed by signal" in death.message
