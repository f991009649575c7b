"""`loaderdoctor run --ceiling` (issue 36) on real workers: the real stream under data-free turns is the stream
without them (a seeded shuffle over a map-style dataset, and an IterableDataset split across workers), the
ceiling is measured and said; two gloo ranks, one of them slow, switch at the same step and neither waits
forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(240)]


def _run(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOADERDOCTOR_HOME": str(cwd / "home")}
    return subprocess.run([sys.executable, "-m", "loaderdoctor", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)  # fmt: skip


def _python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


STREAM = """\
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

class Numbers(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, index):
        time.sleep(0.001)
        return index

class Stream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        return iter(range(info.id, 400, info.num_workers))  # each worker its share, in turns

if sys.argv[1] == "map":
    loader = DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(3))
else:
    loader = DataLoader(Stream(), batch_size=4, num_workers=2)
seen = []
for epoch in range(2):
    for batch in loader:
        time.sleep(0.002)
        seen.append(batch.tolist())
with open(sys.argv[2], "w") as out:
    json.dump(seen, out)
"""


def _real_stream(batches: list[list[int]]) -> list[int]:
    """The loader's samples as the loop got them, less each batch handed again (the same batch once more)."""
    kept = [b for n, b in enumerate(batches) if n == 0 or b != batches[n - 1]]
    return [sample for batch in kept for sample in batch]


@pytest.mark.parametrize(("kind", "options"), [("map", []), ("stream", []), ("map", ["--guard"])])
def test_the_real_stream_under_data_free_turns_is_the_stream_without_them(tmp_path, kind, options):
    """Guarded too: the turns run outside the guard, whose batch plan counts the real batches only."""
    (tmp_path / "stream.py").write_text(STREAM)
    plain = _python(["stream.py", kind, "plain.json"], tmp_path)
    assert plain.returncode == 0, plain.stderr
    args = [*options, "--ceiling", "15", "--no-history", "--json", "out.json", "stream.py", kind, "turns.json"]
    result = _run(args, tmp_path)
    assert result.returncode == 0, result.stderr
    without = json.loads((tmp_path / "plain.json").read_text())
    under = json.loads((tmp_path / "turns.json").read_text())
    assert len(under) == len(without) + 15  # the loop took 15 steps more: the data-free ones
    assert _real_stream(under) == [sample for batch in without for sample in batch]  # every sample once, in order
    (loader,) = json.loads((tmp_path / "out.json").read_text())["loaders"].values()
    ceiling = loader["measurements"]["ceiling"]
    assert ceiling["data_free_steps"] == 15 and ceiling["trained_on_repeated_batches"] is True
    assert ceiling["complete"] and ceiling["ceiling_batches_per_s"] > 0
    assert loader["measurements"]["batches"] == len(without)  # the loader's own batches only
    assert "15 steps trained on repeated batches" in " ".join(result.stderr.split())  # the console wraps it


STARVED = """\
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 2000

    def __getitem__(self, index):
        time.sleep(0.005)  # storage: the worker waits, the core is free
        return torch.zeros(8)

loader = DataLoader(Slow(), batch_size=8, num_workers=1)
for step, batch in enumerate(loader):
    time.sleep(0.005)  # a 5 ms step against 40 ms of loading a batch: input-bound by far
    if step == 150:
        break
"""


def test_a_starved_loop_runs_several_times_faster_with_its_input_taken_away(tmp_path):
    (tmp_path / "starved.py").write_text(STARVED)
    result = _run(["--ceiling", "--no-history", "--json", "out.json", "starved.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    (loader,) = json.loads((tmp_path / "out.json").read_text())["loaders"].values()
    ceiling = loader["measurements"]["ceiling"]
    assert ceiling["speedup"] > 3  # about 8x: 40 ms of loading a batch against a 5 ms step
    assert ceiling["input_cost"] > 0.6
    rules = {f["rule"]: f for f in loader["findings"]}
    assert rules["input-bound"]["severity"] == "critical"
    assert rules["input-bound"]["evidence"]["measured_input_cost"] == pytest.approx(ceiling["input_cost"], abs=0.01)
    assert "input-ceiling" in rules
    assert loader["recording"]["ceiling"]["turns"][0]["kind"] == "real"


RANKS = """\
import time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

class Shards(Dataset):
    def __init__(self, read_s):
        self.read_s = read_s

    def __len__(self):
        return 480

    def __getitem__(self, index):
        time.sleep(self.read_s)
        return torch.ones(8)

dist.init_process_group("gloo")
rank = dist.get_rank()
dataset = Shards(0.004 if rank == 1 else 0.0005)  # rank 1 reads from slow storage: it straggles
loader = DataLoader(Shards(dataset.read_s), batch_size=4, sampler=DistributedSampler(dataset), num_workers=1)
grad = torch.zeros(100)
steps = 0
for batch in loader:
    time.sleep(0.003)
    dist.all_reduce(grad)  # the ranks meet at every step: one more step on one rank would hang the other
    steps += 1
print(f"rank {rank} took {steps} steps", flush=True)
dist.destroy_process_group()
"""


def test_two_ranks_one_slow_switch_at_the_same_step_and_both_end(tmp_path):
    (tmp_path / "ranks.py").write_text(RANKS)
    result = _run(["--nproc-per-node", "2", "--ceiling", "12", "--no-history", "--json", "out.json", "ranks.py"],
                  tmp_path, timeout=200)  # fmt: skip
    assert result.returncode == 0, result.stderr
    # 60 batches per rank, and the same 12 data-free steps on each: had one rank switched apart, the
    # all_reduce of its extra step would have waited forever
    assert "rank 0 took 72 steps" in result.stdout and "rank 1 took 72 steps" in result.stdout
    loaders = json.loads((tmp_path / "out.json").read_text())["loaders"]
    assert len(loaders) == 2
    for loader in loaders.values():
        ceiling = loader["measurements"]["ceiling"]
        assert ceiling["data_free_steps"] == 12 and ceiling["ceiling_batches_per_s"] > 0
    # the job's ceiling, on the lowest rank's loader: each rank's cost beside it
    job = [f for loader in loaders.values() for f in loader["findings"] if f["rule"] == "job-ceiling"]
    assert len(job) == 1 and set(job[0]["evidence"]["input_cost_by_rank"]) == {"0", "1"}
    assert job[0]["evidence"]["ranks_measured"] == 2


LONG = """\
import torch
from torch.utils.data import DataLoader

steps = 0
try:
    for epoch in range(1000):  # far longer than the turns
        for batch in DataLoader(torch.arange(4000), batch_size=4, num_workers=1, persistent_workers=True):
            steps += 1
finally:
    print(f"cleaned up after {steps} steps", flush=True)
"""


def test_ceiling_only_ends_the_script_once_the_turns_are_done(tmp_path):
    (tmp_path / "long.py").write_text(LONG)
    result = _run(["--ceiling-only", "--no-history", "--json", "out.json", "long.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    steps = int(result.stdout.split("cleaned up after ")[1].split()[0])
    assert 60 < steps < 400  # the default 60 data-free steps and the real turns around them, then the end
    assert "the ceiling is measured (60 data-free steps): the run ends here" in result.stderr
    (loader,) = json.loads((tmp_path / "out.json").read_text())["loaders"].values()
    assert loader["measurements"]["ceiling"]["complete"]


def test_the_option_is_checked(tmp_path):
    (tmp_path / "starved.py").write_text(textwrap.dedent(STARVED))
    result = _run(["--ceiling", "2", "starved.py"], tmp_path)
    assert result.returncode == 2 and "--ceiling takes a number of steps, 3 or more" in result.stderr


ONE_CYCLE = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(torch.arange(400), batch_size=4, num_workers=2)
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=2 * len(loader))
steps = 0
for epoch in range(2):
    for batch in loader:
        optimizer.step()
        schedule.step()  # raises once stepped past its 200 steps
        steps += 1
print(f"took {steps} steps", flush=True)
"""


def test_a_schedule_sized_for_the_runs_steps_is_not_stepped_past_its_end(tmp_path):
    """The loop's OneCycleLR would raise a ValueError at the 201st step: the epochs with data-free steps keep their
    length instead, and the run ends as planned, saying so."""
    (tmp_path / "onecycle.py").write_text(ONE_CYCLE)
    result = _run(["--ceiling", "12", "--no-history", "--json", "out.json", "onecycle.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "took 200 steps" in result.stdout
    assert "OneCycleLR is sized for 200 steps and raises past them" in " ".join(result.stderr.split())
    (loader,) = json.loads((tmp_path / "out.json").read_text())["loaders"].values()
    ceiling = loader["measurements"]["ceiling"]
    assert ceiling["data_free_steps"] == 12
    assert ceiling["epochs_kept_length"] == "the loop's OneCycleLR is sized for 200 steps and raises past them"
    assert loader["measurements"]["batches"] == 200 - 12  # the loader's batches: as many fewer, left unasked
