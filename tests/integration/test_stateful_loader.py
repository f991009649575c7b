"""torchdata's StatefulDataLoader, which neither makes nor iterates itself through torch's DataLoader: under
`loaderdoctor run` it is seen, named by its class, and its state_dict() taken mid-epoch under the watch resumes as it
does unwatched (the same samples after the state as a plain run gives); under torchrun its ranks are watched too;
`check` measures it and its fix as a StatefulDataLoader, and the snippet says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(240)]
torchdata = pytest.importorskip("torchdata.stateful_dataloader")

RESUMED = """\
import json, sys, time, torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

class Data(Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([i])

def make():
    return StatefulDataLoader(Data(), batch_size=4, num_workers=2, shuffle=True,
                              generator=torch.Generator().manual_seed(7))

first = make()
seen = []
for n, batch in enumerate(first):  # the first epoch, cut short after 10 batches, its state taken there
    seen += batch.view(-1).tolist()
    if n == 9:
        state = first.state_dict()
        break
second = make()
second.load_state_dict(state)
rest = [i for batch in second for i in batch.view(-1).tolist()]
print(json.dumps({"seen": seen, "rest": rest}))
"""


def _python(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PATH": path})  # fmt: skip


def test_a_stateful_dataloader_is_watched_named_and_its_state_resumes_as_unwatched(tmp_path):
    (tmp_path / "train.py").write_text(RESUMED)
    plain = _python(["train.py"], tmp_path)
    watched = _python(["-m", "loaderdoctor", "run", "--no-history", "--json", "out.json", "train.py"], tmp_path)
    assert plain.returncode == 0 and watched.returncode == 0, plain.stderr + watched.stderr
    samples = json.loads(plain.stdout)
    assert len(samples["seen"]) == 40 and len(samples["rest"]) == 56  # resumed where it was cut
    assert json.loads(watched.stdout) == samples
    assert "no DataLoader delivered a batch" not in watched.stderr
    assert "StatefulDataLoader (torchdata.stateful_dataloader" in " ".join(watched.stderr.split()), watched.stderr
    loaders = json.loads((tmp_path / "out.json").read_text())["loaders"]
    assert sorted(loaders) == ["train.py:13", "train.py:13#2"]
    assert [loaders[name]["measurements"]["batches"] for name in sorted(loaders)] == [10, 14]


DDP = """\
import time, torch, torch.distributed as dist
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

class Slow(Dataset):
    def __len__(self):
        return 128
    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.full((8,), float(i))

dist.init_process_group("gloo")
loader = StatefulDataLoader(Slow(), batch_size=8, num_workers=1, sampler=DistributedSampler(Slow()))
for epoch in range(2):
    loader.sampler.set_epoch(epoch)
    for batch in loader:
        time.sleep(0.002)
dist.destroy_process_group()
"""


def test_the_stateful_dataloaders_of_torchruns_ranks_are_watched(tmp_path):
    (tmp_path / "train.py").write_text(DDP)
    result = _python(["-m", "loaderdoctor", "run", "--no-history", "--json", "out.json", "torchrun", "--standalone",
                      "--nproc-per-node", "2", "train.py"], tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    loaders = json.loads((tmp_path / "out.json").read_text())["loaders"]
    assert sorted(loaders) == ["train.py:14/rank0", "train.py:14/rank1"], result.stderr
    assert [loaders[name]["measurements"]["batches"] for name in sorted(loaders)] == [16, 16]  # 128 / 2 / 8 x 2
    assert "could not be watched" not in result.stderr


STARVED_TARGET = """\
import time, torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

class Slow(Dataset):  # 8 x 3 ms of loading a batch in the training process, against a 5 ms step
    def __len__(self):
        return 512
    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.full((8,), float(i))

def loaders():
    return StatefulDataLoader(Slow(), batch_size=8, num_workers=0, snapshot_every_n_steps=5)
"""


def test_check_measures_a_stateful_dataloader_and_its_fix_as_its_own_class(tmp_path):
    (tmp_path / "data.py").write_text(STARVED_TARGET)
    result = _python(["-m", "loaderdoctor", "check", "data.py:loaders", "--step-ms", "5", "--budget", "30",
                      "--json"], tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stderr  # critical: input-bound
    (loader,) = json.loads(result.stdout)["loaders"].values()
    stateful = "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader"
    assert loader["recording"]["loader_class"] == stateful
    verification = loader["verification"]
    assert verification["verdict"] == "faster", verification
    assert verification["after_recording"]["loader_class"] == stateful
    assert verification["before"] * 2 < verification["after"]  # 8 x 3 ms a batch against 5 ms: far faster
