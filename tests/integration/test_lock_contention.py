"""lock-contention with real workers: the built-in scenario checked as a user runs it (the lock's line named,
its cost proved by a lock-free run), and a shared lock around fast reads left alone."""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import subprocess
import sys

import pytest
import torch
from checkout import checkout_env
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.loader.settings import LoaderSpec
from loaderdoctor.probe.measure import probe
from loaderdoctor.rules import diagnose
from loaderdoctor.scenarios import lock_contention

pytestmark = [pytest.mark.workers, pytest.mark.quiet, pytest.mark.timeout(150)]


def _line_of(function: object, text: str) -> int:
    lines, first = inspect.getsourcelines(function)  # type: ignore[arg-type]
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_the_scenarios_lock_is_named_at_its_line_and_measured_away():
    env = checkout_env()
    command = [sys.executable, "-m", "loaderdoctor", "check", "scenario:lock-contention", "--json", "--budget", "15"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1, result.stderr  # critical
    loader = json.loads(result.stdout)["loaders"]["train"]
    main = loader["findings"][0]
    assert main["rule"] == "lock-contention", [f["rule"] for f in loader["findings"]]
    line = _line_of(lock_contention.LockedPoses.__getitem__, "fcntl.flock(poses, fcntl.LOCK_EX)")
    assert main["evidence"]["site"].endswith(f"lock_contention.py:{line} in __getitem__")
    assert main["evidence"]["lock"] == "fcntl.flock"
    assert main["evidence"]["exclusive_read_only_lock_calls"] > 0
    assert main["evidence"]["writable_lock_calls"] == 0
    assert main["evidence"]["waiting_share"] > 0.5  # 4 workers taking turns: each waits for the other 3
    verification = loader["verification"]
    assert verification["source"] == "lock-free"
    assert verification["settings"] == loader["settings"]  # the same settings, without the lock
    assert verification["verdict"] == "faster", verification["note"]
    assert verification["speedup"] >= 1.5, verification["note"]
    assert verification["note"].startswith("without the lock on read-only files: ")


RECORD_BYTES = 64 * 64 * 3


class SharedLockReads(Dataset):
    """Records read from a read-only file, each under a shared lock (LOCK_SH): readers never wait for readers."""

    def __init__(self, path: str, count: int) -> None:
        self.path = path
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        with open(self.path, "rb") as records:
            fcntl.flock(records, fcntl.LOCK_SH)
            records.seek(index * RECORD_BYTES)
            data = records.read(RECORD_BYTES)
            fcntl.flock(records, fcntl.LOCK_UN)
        pixels = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(64, 64, 3).float()
        return torch.nn.functional.avg_pool2d(pixels.permute(2, 0, 1)[None], 3, 1)[0]  # a little decoding


def test_a_shared_lock_around_fast_reads_is_not_contention(tmp_path):
    path = tmp_path / "records.bin"
    path.write_bytes(os.urandom(RECORD_BYTES * 2048))
    loader = DataLoader(SharedLockReads(str(path), 2048), batch_size=16, num_workers=2, persistent_workers=True)
    rec = probe(LoaderSpec.from_loader(loader), budget_s=3.0, epochs=2)  # no step: loading is all there is
    assert "lock-contention" not in [f.rule for f in diagnose(rec)]
    activity = rec.worker_activity
    assert activity is not None and activity.workers == 2
    assert activity.lock_calls.read_only_shared > 100  # the locks were seen, and cost the workers little
    assert activity.lock_calls.read_only_exclusive == activity.lock_calls.writable == 0
    assert activity.idle_s > 0  # waiting in torch's loop for indices: idle, at no site
    assert not [s for s in activity.sites if s.function == "get" and s.file.endswith("queues.py")]
