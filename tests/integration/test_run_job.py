"""`loaderdoctor run SCRIPT` (one process) watches every Python process the script starts (issue 35.1): the ranks
of mp.spawn, of torchrun run by the script, of Lightning's DDP (which starts rank 1 as `python fit.py`) are each
reported as `--nproc-per-node` reports them; a rank that dies before writing is named; a DataLoader worker runs
the job's hook but writes nothing; a user's own sitecustomize still runs. Gloo ranks on CPU, a worker each."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from loaderdoctor.history.store import load_runs

pytestmark = [pytest.mark.workers, pytest.mark.timeout(240)]


def _run(args: list[str], cwd: Path, timeout: float = 180, env: dict[str, str] | None = None):
    # A TMPDIR of its own (another test's job folder may be in the shared one meanwhile), with a short path:
    # multiprocessing's sockets live there, 107 bytes at most, and pytest's tmp_path under xdist is too long.
    tmpdir = Path(tempfile.mkdtemp(prefix="ld-"))
    try:
        env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONFAULTHANDLER": "1", **(env or {})}
        # its own session: on a timeout the whole tree goes (the launchers the script started, their ranks too)
        process = subprocess.Popen([sys.executable, "-m", "loaderdoctor", "run", *args], cwd=cwd, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
        result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        assert not [name for name in os.listdir(tmpdir) if name.startswith("loaderdoctor-job-")], result.stderr
        return result
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _line(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


def _loaders(folder: Path) -> dict:
    return json.loads((folder / "out.json").read_text())["loaders"]


SPAWN = """\
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

def train(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    loader = DataLoader(torch.arange(96), batch_size=4, num_workers=1)
    for batch in loader:
        pass
    if rank == 1 and "--die" in sys.argv:
        os._exit(3)  # before anything of this rank's is written
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(train, args=(int(sys.argv[1]),), nprocs=2)
    print("spawned ranks done")
"""


def _port() -> str:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_the_ranks_that_mp_spawn_starts_are_each_reported_and_kept(tmp_path):
    _write(tmp_path, "spawned.py", SPAWN)
    result = _run(["--json", "out.json", "spawned.py", _port()], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "spawned ranks done\n"
    site = f"spawned.py:{_line(SPAWN, 'loader = DataLoader')}"
    loaders = _loaders(tmp_path)
    assert sorted(loaders) == [f"{site}/rank0", f"{site}/rank1"], result.stderr
    assert [loaders[name]["measurements"]["batches"] for name in sorted(loaders)] == [24, 24]
    assert sorted(run.name for run in load_runs()) == [f"{site}/rank0", f"{site}/rank1"]
    assert "could not be watched" not in result.stderr


def test_a_rank_that_dies_before_writing_keeps_what_it_measured_as_its_epoch_ended_and_says_so(tmp_path):
    _write(tmp_path, "spawned.py", SPAWN)
    result = _run(["--no-history", "--json", "out.json", "spawned.py", _port(), "--die"], tmp_path)

    assert result.returncode == 1, result.stderr  # mp.spawn raises: rank 1 exited with 3
    said = " ".join(result.stderr.split())
    assert "loaderdoctor run: process " in said and " (rank 1) ended without writing what it measured" in said, said
    assert "its diagnosis covers its first" in said, said
    site = f"spawned.py:{_line(SPAWN, 'loader = DataLoader')}"
    loaders = _loaders(tmp_path)
    assert sorted(loaders) == [f"{site}/rank0", f"{site}/rank1"], result.stderr  # rank 0 ended by mp.spawn's SIGTERM
    assert loaders[f"{site}/rank1"]["measurements"]["batches"] == 24  # its one epoch, kept as it ended
    assert json.loads((tmp_path / "out.json").read_text())["unwatched"] == []


SPAWN_WORKERS = """\
import os, pathlib, sys
import torch
from torch.utils.data import DataLoader, Dataset

class Hooked(Dataset):  # what the job's hook did in the worker that loads each sample
    def __len__(self):
        return 16

    def __getitem__(self, index):
        hook = sys.modules.get("_loaderdoctor_jobhook")
        return torch.tensor([hook is not None, hook is not None and hook._watching is not None,
                             "loaderdoctor.job.process" in sys.modules, os.getpid()])

def job_folder():
    folder = pathlib.Path(os.environ["LOADERDOCTOR_JOB"])
    return sorted((str(path.relative_to(folder)), path.stat().st_mtime_ns) for path in folder.rglob("*"))

if __name__ == "__main__":
    before = job_folder()
    loader = DataLoader(Hooked(), batch_size=4, num_workers=2, multiprocessing_context="spawn")
    rows = torch.cat(list(loader)).tolist()
    print("hooked", sorted({row[0] for row in rows}), "watching", sorted({row[1] for row in rows}),
          "imported", sorted({row[2] for row in rows}), "workers", len({row[3] for row in rows}))
    print("job folder unchanged", job_folder() == before, [name for name, _ in before])
"""


def test_spawned_dataloader_workers_run_the_hook_but_watch_and_write_nothing(tmp_path):
    _write(tmp_path, "workers.py", SPAWN_WORKERS)
    result = _run(["--no-history", "--json", "out.json", "workers.py"], tmp_path)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "hooked [1] watching [0] imported [0] workers 2", result.stdout
    assert lines[1].startswith("job folder unchanged True"), result.stdout
    assert "sitecustomize.py" in lines[1]
    assert list(_loaders(tmp_path)) == [f"workers.py:{_line(SPAWN_WORKERS, 'loader = DataLoader')}"]
    assert "could not be watched" not in result.stderr and "loaderdoctor:" not in result.stderr


UNWATCHABLE = """\
import sys
sys.modules["loaderdoctor.job.process"] = None  # as if loaderdoctor could not be imported in this process
import torch
from torch.utils.data import DataLoader

print(sum(len(batch) for batch in DataLoader(torch.arange(10), batch_size=5)))
"""


def test_a_process_whose_watch_fails_runs_on_told_in_one_line_and_is_named(tmp_path):
    _write(tmp_path, "child.py", UNWATCHABLE)
    _write(tmp_path, "parent.py", "import subprocess, sys\nsubprocess.run([sys.executable, 'child.py'], check=True)\n")
    result = _run(["--no-history", "parent.py"], tmp_path, timeout=120)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "10\n"
    told = [line for line in result.stderr.splitlines() if line.startswith("loaderdoctor: ")]
    assert len(told) == 1 and " are not watched (ModuleNotFoundError: " in told[0], result.stderr
    said = " ".join(result.stderr.split())
    assert "child.py) could not be watched: ModuleNotFoundError: " in said, result.stderr


FOREVER_CHILD = """\
import pathlib, time
import torch
from torch.utils.data import DataLoader

loader = DataLoader(torch.arange(10_000), batch_size=4, num_workers=1, persistent_workers=True)
while True:
    for number, batch in enumerate(loader):
        time.sleep(0.005)
        if number == 20:
            pathlib.Path("started").touch()
"""
TERMINATES = """\
import pathlib, signal, subprocess, sys, time

child = subprocess.Popen([sys.executable, "forever.py"])
deadline = time.monotonic() + 90
while not pathlib.Path("started").exists() and time.monotonic() < deadline and child.poll() is None:
    time.sleep(0.05)
child.send_signal(signal.SIGTERM)
print("child ended with", child.wait(timeout=60))
"""


def test_a_process_ended_by_sigterm_still_writes_what_it_measured(tmp_path):
    _write(tmp_path, "forever.py", FOREVER_CHILD)
    _write(tmp_path, "terminates.py", TERMINATES)
    result = _run(["--no-history", "--json", "out.json", "terminates.py"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "child ended with 143\n", result.stderr  # as a process that SIGTERM ended
    (name, loader), *others = _loaders(tmp_path).items()
    assert not others and name == f"forever.py:{_line(FOREVER_CHILD, 'DataLoader(torch')}/proc1"
    assert loader["measurements"]["batches"] >= 21


TORCHRUN_WORKER = """\
import os, pathlib, sys
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

dist.init_process_group("gloo")
pathlib.Path(f"mark{os.environ['RANK']}").write_text(str(getattr(sys.modules.get("sitecustomize"), "MARK", None)))
for batch in DataLoader(torch.arange(64), batch_size=4, num_workers=1):
    pass
dist.destroy_process_group()
"""
LAUNCHER = """\
import subprocess, sys

subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "worker.py"], check=True)
print("torchrun done")
"""


def test_the_ranks_of_torchrun_run_by_the_script_are_reported_and_a_users_sitecustomize_still_runs(tmp_path):
    _write(tmp_path, "worker.py", TORCHRUN_WORKER)
    _write(tmp_path, "launch.py", LAUNCHER)
    (tmp_path / "custom").mkdir()
    _write(tmp_path / "custom", "sitecustomize.py", 'MARK = "the user\'s"\n')
    result = _run(["--no-history", "--json", "out.json", "launch.py"], tmp_path,
                  env={"PYTHONPATH": str(tmp_path / "custom")})  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout == "torchrun done\n"
    assert [(tmp_path / f"mark{rank}").read_text() for rank in (0, 1)] == ["the user's", "the user's"]
    site = f"worker.py:{_line(TORCHRUN_WORKER, 'DataLoader(torch')}"
    assert sorted(_loaders(tmp_path)) == [f"{site}/rank0", f"{site}/rank1"], result.stderr


LIGHTNING_DDP = """\
import torch
import lightning as L
from torch.utils.data import DataLoader, Dataset

class Pairs(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, index):
        return torch.randn(4), torch.randn(1)

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(Pairs(), batch_size=4)

if __name__ == "__main__":
    L.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False).fit(Model())
    print("fit done")
"""


def test_a_lightning_ddp_fit_reports_both_ranks(tmp_path):
    pytest.importorskip("lightning")
    _write(tmp_path, "fit.py", LIGHTNING_DDP)
    result = _run(["--no-history", "--json", "out.json", "fit.py"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.count("fit done") == 2  # rank 0 (the script, here) and rank 1 (`python fit.py`)
    names = sorted(_loaders(tmp_path))
    assert len(names) == 2 and [name[-6:] for name in names] == ["/rank0", "/rank1"], (names, result.stderr)
    assert names[0].removesuffix("/rank0") == names[1].removesuffix("/rank1")  # one loader, as made in each rank
    assert all(loader["measurements"]["batches"] == 4 for loader in _loaders(tmp_path).values())  # 32 / 2 / 4


@pytest.mark.parametrize(
    "launcher",
    [["torchrun"], ["-m", "torch.distributed.run"]],
    ids=["torchrun-on-PATH", "python-m-torch.distributed.run"],
)
def test_run_of_a_launcher_watches_the_ranks_it_starts(tmp_path, launcher):
    # The README's recipes: `loaderdoctor run torchrun ... train.py`, the launcher found on PATH as a Python
    # console script (it was "no such script: torchrun"), and `loaderdoctor run -m torch.distributed.run ...`.
    _write(tmp_path, "worker.py", TORCHRUN_WORKER)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    result = _run(["--no-history", "--json", "out.json", *launcher, "--standalone", "--nproc-per-node", "2",
                   "worker.py"], tmp_path, env={"PATH": path})  # fmt: skip

    assert result.returncode == 0, result.stderr
    site = f"worker.py:{_line(TORCHRUN_WORKER, 'DataLoader(torch')}"
    assert sorted(_loaders(tmp_path)) == [f"{site}/rank0", f"{site}/rank1"], result.stderr
    target = json.loads((tmp_path / "out.json").read_text())["target"]
    assert target.startswith(" ".join(launcher)), target  # the launcher as it was named, not its path


ACCELERATE_SCRIPT = """\
import sys
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

accelerator = Accelerator(cpu=True)  # no GPU here: gloo across the processes
loader = accelerator.prepare(DataLoader(torch.arange(256).float(), batch_size=8, num_workers=1))
for epoch in range(2):
    for batch in loader:
        pass
accelerator.wait_for_everyone()
sys.stdout.write(f"accelerate done {accelerator.process_index}\\n")  # one write: the two ranks share the pipe
sys.stdout.flush()
"""


def test_run_of_accelerate_launch_watches_both_processes(tmp_path):
    # The README's recipe: `loaderdoctor run accelerate launch --multi_gpu --num_processes 2 ... train.py` (on a
    # CPU, accelerate's multi-process launch is torchrun's, with gloo).
    pytest.importorskip("accelerate")
    _write(tmp_path, "train.py", ACCELERATE_SCRIPT)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    result = _run(["--no-history", "--json", "out.json", "accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "train.py"], tmp_path,
                  env={"PATH": path})  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split("\n")) == ["", "accelerate done 0", "accelerate done 1"]
    site = f"train.py:{_line(ACCELERATE_SCRIPT, 'DataLoader(torch')}"
    loaders = _loaders(tmp_path)
    assert sorted(loaders) == [f"{site}/rank0", f"{site}/rank1"], result.stderr
    assert [loaders[name]["measurements"]["batches"] for name in sorted(loaders)] == [32, 32]  # 256 / 2 / 8 × 2
    assert "could not be watched" not in result.stderr
