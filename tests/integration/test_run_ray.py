"""`loaderdoctor run train_ray.py` with Ray Train's TorchTrainer (issue 48.5): the two CPU workers (gloo) each
iterate a loader that prepare_data_loader gave a DistributedSampler; Ray ends its workers with no exit (no atexit),
right after they leave their process group, which keeps what each measured: both ranks are named by Ray's world
rank, with all their epochs, none "could not be watched", no distributed-sampler, and no process of Ray's is left.
Skipped where ray[train] is not installed (the `ray` extra: `make test` does not install it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(240)]

try:
    import ray.train.torch  # noqa: F401
except ImportError as missing:
    pytest.skip(f"ray[train] is not installed ({missing}): pip install -e '.[ray]'", allow_module_level=True)

TRAIN_RAY = """\
import sys, time
import ray
import torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        time.sleep(0.002)
        return torch.tensor([float(index)])

def train_loop_per_worker(config):
    loader = DataLoader(Slow(), batch_size=4, shuffle=True)
    loader = prepare_data_loader(loader, move_to_device=False)  # a DistributedSampler, by Ray's world rank
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            time.sleep(0.06)  # the step: 8 batches per rank, each epoch over 0.5 s
    ray.train.report({"epochs": 3})

if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=sys.argv[1])
    try:
        trainer = TorchTrainer(train_loop_per_worker, scaling_config=ScalingConfig(num_workers=2, use_gpu=False))
        print("ray train done", trainer.fit().error)
    finally:
        ray.shutdown()
"""


def _line(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def _left_of(session: Path) -> list[str]:
    """The processes that still run with the test's Ray folder on their command line (Ray's raylet, GCS, workers)."""
    left = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        with_it = " ".join(process.info["cmdline"] or [])
        if str(session) in with_it and process.pid != os.getpid():
            left.append(f"{process.pid} {with_it[:200]}")
    return left


def test_ray_trains_two_workers_each_named_by_its_world_rank_with_all_its_epochs(tmp_path):
    (tmp_path / "train_ray.py").write_text(TRAIN_RAY)
    session = Path("/tmp") / f"ld-ray-{os.getpid()}"  # Ray's sockets live there: 107 bytes at most
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    process = subprocess.Popen(
        [sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--json", "out.json", "train_ray.py",
         str(session)], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"loaderdoctor run did not end: {stderr[-3000:]}")
    finally:
        left = _left_of(session)
        for line in left:
            with_pid = int(line.split()[0])
            with contextlib.suppress(psutil.Error):
                psutil.Process(with_pid).kill()
        subprocess.run(["rm", "-rf", str(session)], check=False)

    assert process.returncode == 0, stderr
    assert "ray train done None" in stdout, stderr
    assert not left, left  # ray.shutdown() ended Ray's own processes, as it does without loaderdoctor
    said = " ".join(stderr.split())
    assert "could not be watched" not in said, said
    assert "no DataLoader delivered a batch" not in said, said
    assert said.count("after it left its process group (as Ray ends its workers)") == 2, said
    report = json.loads((tmp_path / "out.json").read_text())
    site = f"train_ray.py:{_line(TRAIN_RAY, 'loader = DataLoader')}"
    loaders = report["loaders"]
    assert sorted(loaders) == [f"{site}/rank0", f"{site}/rank1"], said
    for name, loader in loaders.items():
        assert loader["measurements"]["epochs"] == 3, name  # every epoch, not the first alone
        assert loader["measurements"]["batches"] == 24, name
        assert loader["recording"]["sampler_distributed"] is True, name
        assert "distributed-sampler" not in [finding["rule"] for finding in loader["findings"]], name
    assert report["unwatched"] == []
