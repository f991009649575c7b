"""`loaderdoctor run` names a worker's death from the worker itself (issue 46.1-2): a segfault, SIGKILL or the OOM
killer at one sample of an ordinary training script is a critical worker-crash naming the sample and the signal,
first in the report, wherever torch's SIGCHLD handler raised the death (the user's backward, the optimizer's step,
the loop's next()); under --guard, once the guard gives up, the same, with its restarts said."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(300)]

# A small convnet trained on samples of which one (137, in batch 17) ends its worker. The worker holding it waits
# until the main thread is where the death must surface ("ready"): in the backward of batch 16, in the optimizer's
# step after it, or in the next() that waits for batch 17 itself.
SCRIPT = """\
import ctypes, os, pathlib, signal, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

HOW, WHERE, PERSISTENT, METHOD = sys.argv[1], sys.argv[2], sys.argv[3] == "persistent", sys.argv[4]
KILLER, BATCH = 137, 8
READY = pathlib.Path("ready")


def wait(deadline_s):
    end = time.monotonic() + deadline_s
    while not READY.exists() and time.monotonic() < end:
        time.sleep(0.002)


class Images(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, index):
        if index == KILLER:  # every time: a guard that starts its workers again meets it again
            wait(30)
            if HOW == "segfault":
                ctypes.string_at(0)  # a null-pointer read, as a native decoder makes on a corrupt file
            elif HOW == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:  # the OOM killer: more memory than the job's cgroup allows
                blocks = []
                while True:
                    blocks.append(bytearray(64 * 2**20))
                    blocks[-1][::4096] = b"x" * len(blocks[-1][::4096])
        return torch.randn(3, 16, 16), index % 10


def where(place, step):
    if WHERE == place and step == KILLER // BATCH - 1:
        READY.touch()
        end = time.monotonic() + 20
        while time.monotonic() < end:  # Python running (as a hook or a custom Function's backward runs): the
            pass  # worker's death is raised here by torch's SIGCHLD handler, within a moment


class Traced(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        where("backward", STEP[0])
        return grad


STEP = [0]


def main():
    loader = DataLoader(Images(), batch_size=BATCH, num_workers=2, persistent_workers=PERSISTENT,
                        multiprocessing_context=METHOD)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        batches = iter(loader)
        for step in range(len(loader)):
            STEP[0] = step
            if WHERE == "tap" and step == KILLER // BATCH:
                READY.touch()
            x, y = next(batches)
            loss = nn.functional.cross_entropy(model(Traced.apply(x.requires_grad_())), y)
            opt.zero_grad()
            loss.backward()
            where("step", step)
            opt.step()
    print("trained to the end")


if __name__ == "__main__":
    main()
"""

# Where torch's error was raised, as the script's traceback shows it (each case's line of the script).
SURFACED = {"backward": 'where("backward", STEP[0])', "step": 'where("step", step)', "tap": "x, y = next(batches)"}


def _run(folder: Path, *args: str, guard: bool = False, preexec=None) -> tuple[subprocess.CompletedProcess, dict]:
    (folder / "train.py").write_text(SCRIPT)
    command = [sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--json", "out.json"]
    result = subprocess.run(
        [*command, *(["--guard"] if guard else []), "train.py", *args], cwd=folder, capture_output=True, text=True,
        timeout=240, preexec_fn=preexec,
    )  # fmt: skip
    report = json.loads((folder / "out.json").read_text())
    (loader,) = report["loaders"].values()
    return result, loader


def _says_the_crash(result: subprocess.CompletedProcess, loader: dict, signal_name: str) -> dict:
    """The report's first finding: a critical worker-crash naming the sample and the signal."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "trained to the end" not in result.stdout
    first = loader["findings"][0]
    assert (first["rule"], first["severity"]) == ("worker-crash", "critical"), result.stderr[-3000:]
    assert (first["evidence"]["index"], first["evidence"]["signal"]) == (137, signal_name), first
    assert "dataset[137]" in first["title"] and signal_name in first["title"]
    assert "critical worker-crash" in result.stderr
    return first


@pytest.mark.parametrize(
    ("how", "where", "persistent", "method"),
    [
        ("segfault", "backward", "persistent", "fork"),
        ("segfault", "step", "once", "spawn"),
        ("segfault", "tap", "once", "fork"),
        ("sigkill", "step", "once", "fork"),
        ("sigkill", "backward", "persistent", "spawn"),
        ("sigkill", "tap", "persistent", "fork"),
    ],
)
def test_a_worker_that_dies_at_one_sample_is_a_critical_crash_naming_it_wherever_torch_raised_it(
    tmp_path, how, where, persistent, method
):
    result, loader = _run(tmp_path, how, where, persistent, method)
    assert SURFACED[where] in result.stderr, result.stderr[-3000:]  # the death surfaced where this case wants it
    _says_the_crash(result, loader, {"segfault": "SIGSEGV", "sigkill": "SIGKILL"}[how])


def test_a_worker_the_oom_killer_ends_is_a_crash_naming_the_sample_and_the_oom_killer(tmp_path):
    with _memory_cgroup(limit_bytes=1536 * 2**20) as enter:
        result, loader = _run(tmp_path, "oom", "step", "persistent", "fork", preexec=enter)
    first = _says_the_crash(result, loader, "SIGKILL")
    assert first["evidence"]["oom_kill"] is True and "OOM killer" in first["title"]


def test_under_guard_the_crash_after_it_gives_up_leads_with_the_sample_the_signal_and_the_restarts(tmp_path):
    result, loader = _run(tmp_path, "segfault", "tap", "persistent", "fork", guard=True)
    # The guard started the workers again (the sample kills each in turn) and gave up: the script ends there.
    assert "LoaderGaveUp" in result.stderr and "restart 3 of at most 3" in result.stderr, result.stderr[-3000:]
    first = _says_the_crash(result, loader, "SIGSEGV")
    assert first["evidence"]["restarts"] == 3 and "after 3 restarts" in first["title"]
    assert first["evidence"]["deaths"] == 4  # each restart's worker died on it too


@contextlib.contextmanager
def _memory_cgroup(limit_bytes: int) -> Iterator:
    """A memory cgroup of this test's own with `limit_bytes`, and the preexec_fn that puts a child in it (v1 or v2;
    skipped, with the reason, where none can be made: not root, no memory controller)."""
    if os.geteuid() != 0:
        pytest.skip("a memory cgroup needs root")
    name = f"loaderdoctor-test-{uuid.uuid4().hex[:8]}"
    made = None
    for version, parent, limit in (
        ("v2", Path("/sys/fs/cgroup"), "memory.max"),
        ("v2", Path("/sys/fs/cgroup/unified"), "memory.max"),
        ("v1", Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
    ):
        controllers = parent / "cgroup.controllers"
        if version == "v2" and not (controllers.exists() and "memory" in controllers.read_text().split()):
            continue
        if version == "v1" and not (parent / "memory.limit_in_bytes").exists():
            continue
        try:
            (parent / name).mkdir()
        except OSError:
            continue
        try:
            (parent / name / limit).write_text(str(limit_bytes))
        except OSError:
            (parent / name).rmdir()
            continue
        made = parent / name
        break
    if made is None:
        pytest.skip("no memory cgroup could be made here (no writable v1 or v2 memory controller)")
    procs = str(made / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as file:
            file.write(str(os.getpid()))

    try:
        yield enter
    finally:
        with contextlib.suppress(OSError):
            made.rmdir()
