"""Issue 33.14: torch's own exit tests run against the guard. They read the iterator's `_workers` (the list of its
worker processes), which the guard's iterator exposes as torch's does; with it they must pass: workers end when
the iterator is dropped part-way, when the loading process raises, when a worker raises, and when one is killed.

Ported from pytorch/pytorch test/test_dataloader.py (BSD-3-Clause): TestDataLoader.test_partial_workers and
test_proper_exit (with TestDataLoaderPersistentWorkers, which runs them with persistent workers), and the part of
_test_get_worker_info that reads `_workers` after the epoch. test_proper_exit's loading process is
proper_exit_loader.py; of its matrix, the map-style cases with workers (those the guard takes over), each exit
method, with and without a reference held to the iterator.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from sessions import kill_session, session_processes
from torch.utils.data import Dataset, TensorDataset, get_worker_info

import loaderdoctor

pytestmark = [pytest.mark.workers, pytest.mark.timeout(90)]

JOIN_TIMEOUT = 30.0  # torch's is 60 s; this test's own timeout bounds the whole case
_LOADER = Path(__file__).with_name("proper_exit_loader.py")


def _tensor_dataset() -> TensorDataset:
    return TensorDataset(torch.randn(100, 2, 3, 5), torch.randperm(50).repeat(2))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("persistent_workers", [False, True], ids=["plain", "persistent"])
def test_partial_workers(persistent_workers):
    """Check that workers exit even if the iterator is not exhausted."""
    with loaderdoctor.patched():
        loader = iter(
            torch.utils.data.DataLoader(
                _tensor_dataset(), batch_size=2, num_workers=4, persistent_workers=persistent_workers
            )
        )
    workers = loader._workers
    assert len(workers) == 4 and all(w.is_alive() for w in workers)
    for i, _ in enumerate(loader):
        if i == 10:
            break
    assert i == 10
    del loader
    for w in workers:
        w.join(JOIN_TIMEOUT)
        assert not w.is_alive(), "subprocess not terminated"


class _WhoLoads(Dataset):
    """Each sample is the worker id and pid that loaded it (torch's TestWorkerInfoDataset, without its sync)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([get_worker_info().id, os.getpid()])


def test_workers_read_after_the_epoch_are_those_that_loaded_it():
    with loaderdoctor.patched():
        loader = torch.utils.data.DataLoader(_WhoLoads(), batch_size=2, num_workers=2, persistent_workers=False)
    it = iter(loader)
    data = torch.cat(list(it), 0)
    worker_pids = [w.pid for w in it._workers]
    for worker_id, pid in data.tolist():
        assert pid == worker_pids[worker_id]


def test_workers_after_a_restart_are_the_new_ones():
    """When the guard restarts its workers (one was killed), `_workers` lists the new ones, as a new torch
    iterator's would; the list taken before holds the old ones, all ended."""
    loader = loaderdoctor.DataLoader(_WhoLoads(), batch_size=1, num_workers=2, persistent_workers=False)
    try:
        it = iter(loader)
        before = it._workers
        next(it)
        os.kill(before[-1].pid, signal.SIGKILL)
        delivered = 1 + len(list(it))
        after = it._workers
        assert delivered == 6
        assert loader.restarts == 1
        assert len(after) == 2 and not {w.pid for w in after} & {w.pid for w in before}
        for w in before:
            w.join(JOIN_TIMEOUT)
            assert not w.is_alive()
    finally:
        loader.close()


def test_no_workers_no_attribute():
    """Like torch's iterator without workers, the guard's has no `_workers` then."""
    it = iter(loaderdoctor.DataLoader(_WhoLoads(), batch_size=2, num_workers=0))
    with pytest.raises(AttributeError):
        _ = it._workers


# (exit method, hold a reference to the iterator, persistent workers): every exit method, both ways of holding.
_PROPER_EXIT = [
    ("none", False, False),
    ("none", True, True),
    ("loader_error", True, False),
    ("loader_error", False, True),
    ("worker_error", True, True),
    ("worker_error", False, False),
    ("worker_kill", True, False),
    ("worker_kill", False, True),
]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the loading process's session")
@pytest.mark.parametrize(("exit_method", "hold", "persistent"), _PROPER_EXIT)
def test_proper_exit(tmp_path, exit_method, hold, persistent):
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        loader_p = subprocess.Popen(
            [sys.executable, str(_LOADER), exit_method, str(int(hold)), str(int(persistent)), str(tmp_path / "error")],
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # the loading process and everything it starts share its session id
        )
    try:
        loader_p.wait(JOIN_TIMEOUT)
        reports = [json.loads(line) for line in out.read_text().splitlines()]
        assert reports and len(reports[0].get("workers", [])) == 2, err.read_text()[-3000:]
        worker_ps = [psutil.Process(pid) for pid in reports[0]["workers"] if psutil.pid_exists(pid)]
        _, alive = psutil.wait_procs(worker_ps, timeout=JOIN_TIMEOUT)
        assert not alive, f"worker process (pid(s) {[p.pid for p in alive]}) did not terminate"
        deadline = time.monotonic() + 10
        while (left := session_processes(loader_p.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"alive after the loading process ended: {left}"
        if exit_method in ("none", "worker_kill"):  # the guard recovers from the killed worker
            assert loader_p.returncode == 0, err.read_text()[-3000:]
        else:
            assert loader_p.returncode != 0
            error = reports[-1]
            expected = "Loader error" if exit_method == "loader_error" else "Worker error"
            assert error.get("runtime_error") and expected in error["message"], error
    finally:
        if loader_p.poll() is None:
            loader_p.kill()
            loader_p.wait()
        kill_session(loader_p.pid)
