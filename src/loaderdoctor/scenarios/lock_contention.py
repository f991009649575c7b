"""lock-contention: every worker takes an exclusive lock on one shared, read-only file for each slow read.

Reproduces a job whose dataset reads poses from one file on shared storage and, to be safe, wraps each read in
fcntl.flock(f, LOCK_EX): every DataLoader worker (of every rank, under DDP) waits for the others, so the
workers read one at a time, however many there are, and 4 GPUs go no faster than 1. Nobody writes the file:
the lock protects nothing. The fix: no lock for reads of a file nobody writes, or a shared lock (LOCK_SH)
where a writer may come, so that readers run together.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.errors import UsageError
from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import rank_sampler

SUMMARY = "4 workers take an exclusive flock on one read-only file around each slow read: they read one at a time"

STORAGE_LATENCY_S = 0.008  # each read waits this long on the (simulated) shared storage, the lock held
POSE_FLOATS = 64  # a pose: 64 float32 values
POSES = 512


def private_folder(name: str, parent: str | None = None) -> str:
    """A folder of this user's alone under the temporary folder (`name-UID`, mode 0700), made if missing and
    checked when found: a real folder, not a link, owned by this user, open to nobody else. Another user who made
    it first (to have this one write through a link of theirs) gets an error, never a write."""
    directory = os.path.join(parent or tempfile.gettempdir(), f"{name}-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise UsageError(
            f"{directory} is not a private folder of this user (a link, another user's, or open to others)",
            hint="remove it, or point TMPDIR at a folder of your own",
        )
    return directory


def shared_pose_file(poses: int = POSES, parent: str | None = None) -> str:
    """The path of the pose file every process of a run shares, in a private folder of this user's, created once
    with the same seeded contents: written to a new file (never through a link) and renamed into place, since
    several ranks may race to create it."""
    path = os.path.join(private_folder("loaderdoctor-scenarios", parent), f"poses-{poses}x{POSE_FLOATS}.f32")
    if not os.path.exists(path):
        values = np.random.default_rng(0).standard_normal((poses, POSE_FLOATS), dtype=np.float32)
        partial = f"{path}.{os.getpid()}.partial"
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(values.tobytes())
        os.replace(partial, path)
    return path


class LockedPoses(Dataset):
    """Poses read from a shared file, each read under an exclusive lock held while storage answers."""

    def __init__(self, path: str, poses: int) -> None:
        self.path = path
        self.poses = poses

    def __len__(self) -> int:
        return self.poses

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        record_bytes = POSE_FLOATS * 4
        with open(self.path, "rb") as poses:
            fcntl.flock(poses, fcntl.LOCK_EX)  # "to be safe": every reader waits for the one inside
            try:
                poses.seek(index * record_bytes)
                data = poses.read(record_bytes)
                time.sleep(STORAGE_LATENCY_S)  # the read waits on shared storage, the lock still held
            finally:
                fcntl.flock(poses, fcntl.LOCK_UN)
        return torch.from_numpy(np.frombuffer(data, dtype=np.float32).copy()), index % 10


def build() -> Workload:
    dataset = LockedPoses(shared_pose_file(), POSES)
    # Under torch.distributed (`loaderdoctor scale`) each rank reads its share, and every worker of every rank
    # contends for the same file's lock.
    loader = DataLoader(dataset, batch_size=8, sampler=rank_sampler(dataset), num_workers=4, persistent_workers=True)
    return Workload(train=loader, step_ms=15)
