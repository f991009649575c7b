"""The guard against real workers that hang, are killed, segfault, or fork with a lock held, and against loading
in the main process that hangs: every batch of every epoch exactly once and in order, as the plain DataLoader
delivers them, with events saying what happened."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from faults import strikes
from torch.utils.data import DataLoader, Dataset, get_worker_info

from loaderdoctor.errors import LoaderDoctorError, LoaderDoctorWarning
from loaderdoctor.guard import guard
from loaderdoctor.tap.watchdog import StallPolicy

pytestmark = [pytest.mark.workers, pytest.mark.timeout(90)]

# A planted hang is forever and the healthy batches take milliseconds, so a 1.5 s floor loses no margin; the
# first batch (start-up, ~1-2 s under forkserver and spawn on 2 cores) keeps a generous deadline.
QUICK = StallPolicy(floor_s=1.5, first_batch_s=20.0)
SEED = 1234
N = 64  # 16 batches of 4
_LOCK = threading.Lock()


class Faulty(Dataset):
    """Returns its index. In a worker (and in the main process too, `in_main`), at index `at`, hangs, SIGKILLs or
    segfaults itself: once (a marker file says it happened, so the retry goes through), or every time; and only
    once `arm_file` exists, if given."""

    def __init__(
        self,
        at: int,
        fault: str,
        marker_dir: Path,
        *,
        once: bool = True,
        arm_file: Path | None = None,
        in_main: bool = False,
    ):
        self.at = at
        self.fault = fault
        self.marker = str(marker_dir / f"fault-{at}")
        self.once = once
        self.arm_file = None if arm_file is None else str(arm_file)
        self.in_main = in_main

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        loading_here = self.in_main or get_worker_info() is not None
        if index == self.at and loading_here and self._strikes():
            if self.fault == "hang":
                threading.Event().wait()  # the planted hang
            elif self.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.fault == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
        return index

    def _strikes(self) -> bool:
        return strikes(self.marker, arm_file=self.arm_file, once=self.once)
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


class NeedsTheLock(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        with _LOCK:
            return index


class RandomCrops(Dataset):
    """An index and a draw from the worker's random state, as random augmentations make."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        return index, torch.rand(2)


@pytest.fixture
def lock_held():
    """A parent thread holding _LOCK while workers fork, as a metrics client's flusher might."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _LOCK:
            held.set()
            release.wait()

    thread = threading.Thread(target=hold, name="lock-holder")
    thread.start()
    held.wait()
    yield
    release.set()
    thread.join()


def _index_in(epoch: int, batch: int) -> int:
    """An index the plain DataLoader delivers in that batch: a fault there strikes after the first batch,
    whose longer deadline is for start-up."""
    return _plain_epochs(list(range(N)), epoch + 1)[epoch][batch][0]


def _loader(dataset: Dataset, **kwargs) -> DataLoader:
    return DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(SEED), **kwargs)


def _plain_epochs(dataset: Dataset, epochs: int) -> list[list[list[int]]]:
    """What the plain DataLoader delivers (in the main process, where the faults never strike)."""
    plain = _loader(dataset)
    return [[b.tolist() for b in plain] for _ in range(epochs)]


def _run(guarded, epochs: int, *, step_s: float = 0.0, before_epoch=None) -> list[list[list[int]]]:
    got = []
    for epoch in range(epochs):
        if before_epoch is not None:
            before_epoch(epoch)
        batches = []
        for batch in guarded:
            batches.append(batch.tolist())
            time.sleep(step_s)  # a training step: worker deaths also come while the user's code runs
        got.append(batches)
    return got


def _kinds(guarded) -> list[str]:
    return [e.kind for e in guarded.events if not (e.kind == "setting-changed" and "persistent" in e.message)]


def _line_of(text: str) -> int:
    with open(__file__) as source:
        return next(number for number, line in enumerate(source, 1) if text in line and "_line_of" not in line)


@pytest.mark.parametrize(
    ("start_method", "workers", "persistent", "next_method"),
    [("fork", 1, None, "forkserver"), ("fork", 2, False, "forkserver"), ("forkserver", 2, None, "spawn")],
)
def test_a_worker_hanging_in_a_later_epoch_is_restarted_one_rung_safer(
    tmp_path, start_method, workers, persistent, next_method
):
    arm = tmp_path / "arm"
    at = _index_in(epoch=1, batch=6)
    dataset = Faulty(at=at, fault="hang", marker_dir=tmp_path, arm_file=arm)
    extra = {} if persistent is None else {"persistent_workers": persistent}
    user = _loader(dataset, num_workers=workers, multiprocessing_context=start_method, **extra)
    started = time.monotonic()
    with guard(user, stall_timeout=QUICK) as guarded:
        got = _run(guarded, 3, before_epoch=lambda epoch: epoch == 1 and arm.touch())
        assert time.monotonic() - started < 40
        assert got == _plain_epochs(dataset, 3)
        assert _kinds(guarded) == ["stall", "restart"]
        stall, restart = guarded.events[-2:]
        assert (stall.epoch, stall.batch) == (1, 6) == (restart.epoch, restart.batch)
        expected_frame = f"{__file__}:{_line_of('# the planted hang')} in __getitem__"
        assert [s["stuck_frame"] for s in stall.detail["stacks"] if s["stuck_frame"]] == [expected_frame]
        assert expected_frame in stall.message
        assert restart.detail["after"]["start_method"] == next_method
        assert restart.detail["after"]["num_workers"] == workers
        assert guarded.settings.start_method == next_method and guarded.restarts == 1


@pytest.mark.parametrize(
    ("fault", "start_method", "workers", "persistent"),
    [
        ("kill", "fork", 2, None),
        ("kill", "forkserver", 1, False),
        ("segfault", "fork", 1, False),
        ("segfault", "forkserver", 2, None),
    ],
)
def test_a_worker_that_dies_is_replaced_and_its_batch_delivered(tmp_path, fault, start_method, workers, persistent):
    dataset = Faulty(at=_index_in(epoch=0, batch=8), fault=fault, marker_dir=tmp_path)
    extra = {} if persistent is None else {"persistent_workers": persistent}
    user = _loader(dataset, num_workers=workers, multiprocessing_context=start_method, **extra)
    with guard(user, stall_timeout=QUICK) as guarded:
        got = _run(guarded, 2, step_s=0.01)
        assert got == _plain_epochs(dataset, 2)
        assert _kinds(guarded) == ["worker-died", "restart"]
        died, restart = guarded.events[-2:]
        # Workers load ahead: the death may be seen while an earlier batch is the next to deliver.
        assert died.epoch == 0 and 2 <= died.batch <= 8 and restart.detail["resume_at"] == died.batch
        assert any(words in died.message for words in ("exited unexpectedly", "killed by signal", "exited: "))
        assert restart.detail["before"]["start_method"] == start_method


def test_a_lock_held_at_fork_is_avoided_up_front_with_forkserver(lock_held):
    dataset = NeedsTheLock()
    with guard(_loader(dataset, num_workers=2), stall_timeout=QUICK) as guarded:
        assert _run(guarded, 2) == _plain_epochs_without_lock(dataset, 2)
        assert _kinds(guarded) == ["setting-changed"]
        (change,) = [e for e in guarded.events if e.detail.get("setting") == "start_method"]
        assert change.detail["before"] == "fork" and change.detail["after"] == "forkserver"
        assert "lock-holder" in change.message
        assert guarded.restarts == 0


def test_an_explicit_fork_is_kept_with_a_warning_and_its_hang_recovered(lock_held):
    dataset = NeedsTheLock()
    user = _loader(dataset, num_workers=1, multiprocessing_context="fork")
    with guard(user, stall_timeout=StallPolicy(floor_s=1.5, first_batch_s=5.0)) as guarded:
        with pytest.warns(LoaderDoctorWarning, match="chosen explicitly, so it is kept"):
            got = _run(guarded, 1)
        assert got == _plain_epochs_without_lock(dataset, 1)
        assert _kinds(guarded) == ["stall", "restart"]
        assert guarded.events[-2].batch == 0 and guarded.settings.start_method == "forkserver"


def test_past_max_restarts_the_error_names_the_batch_the_frame_and_the_settings_tried(tmp_path):
    dataset = Faulty(at=_index_in(epoch=0, batch=5), fault="hang", marker_dir=tmp_path, once=False)
    user = _loader(dataset, num_workers=1, multiprocessing_context="fork")
    # After the restart the hanging batch is the new workers' first: the start-up deadline applies.
    with guard(user, stall_timeout=StallPolicy(floor_s=1.5, first_batch_s=5.0), max_restarts=1) as guarded:
        batches = []
        with pytest.raises(LoaderDoctorError) as raised:
            batches.extend(b.tolist() for b in guarded)
        hung_batch = 5
        assert batches == _plain_epochs(dataset, 1)[0][:hung_batch]
        assert _kinds(guarded) == ["stall", "restart", "stall"]
    message = raised.value.message
    assert f"gave up at epoch 0, batch {hung_batch} of 16: a stall, after 1 restart (max_restarts=1)" in message
    assert f"{__file__}:{_line_of('# the planted hang')} in __getitem__" in message
    assert "1 worker, prefetch 2, persistent, fork -> 1 worker, prefetch 2, persistent, forkserver" in message
    assert raised.value.hint


def test_a_main_process_hang_moves_loading_to_a_spawned_worker_and_every_index_comes_once(tmp_path):
    dataset = Faulty(at=_index_in(epoch=0, batch=5), fault="hang", marker_dir=tmp_path, in_main=True)
    with guard(_loader(dataset), stall_timeout=QUICK) as guarded:
        assert _run(guarded, 2) == _plain_epochs(list(range(N)), 2)
        assert _kinds(guarded) == ["stall", "restart"]
        stall, restart = guarded.events
        assert (stall.batch, restart.detail["resume_at"]) == (5, 5) and "interrupting it" in stall.message
        expected_frame = f"{__file__}:{_line_of('# the planted hang')} in __getitem__"
        assert stall.detail["stacks"][0]["stuck_frame"] == expected_frame
        assert restart.detail["escalated"] and restart.detail["after"]["num_workers"] == 1
        assert restart.detail["after"]["start_method"] == "spawn" and not restart.detail["after"]["persistent_workers"]
        assert "loading moves out of the main process" in restart.message and "the last rung" in restart.message


def test_a_hang_that_follows_loading_into_the_spawned_worker_ends_the_ladder_there(tmp_path):
    dataset = Faulty(at=_index_in(epoch=0, batch=5), fault="hang", marker_dir=tmp_path, once=False, in_main=True)
    # After the restart the hanging batch is the spawned worker's first: the start-up deadline applies.
    with guard(_loader(dataset), stall_timeout=StallPolicy(floor_s=1.5, first_batch_s=8.0)) as guarded:
        batches = []
        with pytest.raises(LoaderDoctorError) as raised:
            batches.extend(b.tolist() for b in guarded)
        assert batches == _plain_epochs(list(range(N)), 1)[0][:5]  # the plain reference, without the fault
        assert _kinds(guarded) == ["stall", "restart", "stall"]  # not back to the main process
    message = raised.value.message
    assert "gave up at epoch 0, batch 5 of 16: a stall, after 1 restart (max_restarts=3)" in message
    assert "no workers (main process) -> 1 worker, prefetch 2, spawn." in message
    assert "moved out of the main process to one spawned worker already: the last rung" in message


def test_without_faults_workers_give_what_the_plain_loader_gives_random_draws_included():
    def make() -> DataLoader:
        return DataLoader(
            RandomCrops(),
            batch_size=4,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            multiprocessing_context="fork",
            generator=torch.Generator().manual_seed(SEED),
        )

    plain = make()
    expected = [list(plain) for _ in range(2)]
    plain._iterator._shutdown_workers()
    with guard(make()) as guarded:
        got = [list(guarded) for _ in range(2)]
        assert guarded.events == []
    for got_epoch, expected_epoch in zip(got, expected, strict=True):
        for (index, draws), (expected_index, expected_draws) in zip(got_epoch, expected_epoch, strict=True):
            assert torch.equal(index, expected_index) and torch.equal(draws, expected_draws)


def test_a_plain_loader_beside_the_guarded_one_is_untouched_by_its_recovery(tmp_path):
    dataset = Faulty(at=_index_in(epoch=0, batch=8), fault="kill", marker_dir=tmp_path)
    val = DataLoader(list(range(12)), batch_size=4, num_workers=1, persistent_workers=True)
    try:
        with guard(_loader(dataset, num_workers=2, multiprocessing_context="fork"), stall_timeout=QUICK) as train:
            got = []
            for batch in train:
                got.append(batch.tolist())
                if len(got) % 4 == 0:
                    assert [b.tolist() for b in val] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
            assert got == _plain_epochs(dataset, 1)[0]
            assert _kinds(train) == ["worker-died", "restart"]
    finally:
        if val._iterator is not None:
            val._iterator._shutdown_workers()


def _plain_epochs_without_lock(dataset: Dataset, epochs: int) -> list[list[list[int]]]:
    # The lock is held by the test's thread: the plain reference loads indices without the dataset.
    plain = _loader(list(range(len(dataset))))
    return [[b.tolist() for b in plain] for _ in range(epochs)]
