"""`loaderdoctor run` on unmodified scripts, each in a process of its own: the diagnosis from the script's real
steps, kept in the history; the script's own output, argv, logging and exit status; a script that raises or is
killed still leaves its summary; -m MODULE; two gloo ranks of which one reads slow storage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loaderdoctor.history.store import load_runs

pytestmark = [pytest.mark.workers, pytest.mark.timeout(240)]

STARVED = """\
import logging, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):  # 4 x 10 ms of loading per batch in the main process, against a 2 ms step
    def __len__(self):
        return 64

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.tensor([index], dtype=torch.float32)

def main():
    logging.basicConfig(level=logging.INFO, format="SCRIPT-LOG %(message)s")
    loader = DataLoader(Slow(), batch_size=4)
    assert type(loader) is DataLoader and isinstance(loader, DataLoader)
    logging.info("training")
    print("argv", sys.argv[1:])
    for epoch in range(2):
        for batch in loader:
            time.sleep(0.002)
    print("trained", __name__)
    sys.exit(int(sys.argv[1]))

if __name__ == "__main__":
    main()
"""


def _run(args: list[str], cwd: Path, timeout: float = 120, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loaderdoctor", "run", *args], cwd=cwd, capture_output=True, text=True,
        timeout=timeout, **popen,
    )  # fmt: skip


def _line(text: str, needle: str) -> int:
    """The number of the line of `text` where `needle` is."""
    return next(n for n, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_starved_script_is_input_bound_kept_in_the_history_and_its_output_and_status_are_its_own(tmp_path):
    _write(tmp_path, "train.py", STARVED)
    result = _run(["--json", "out.json", "train.py", "3", "--json", "theirs"], tmp_path)

    assert result.returncode == 3, result.stderr
    assert result.stdout == "argv ['3', '--json', 'theirs']\ntrained __main__\n"  # the script's, and only it
    assert "SCRIPT-LOG training" in result.stderr  # its logging.basicConfig() still works
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["command"] == "run" and report["target"] == "train.py 3 --json theirs"
    name = f"train.py:{_line(STARVED, 'DataLoader(Slow')}"
    assert list(report["loaders"]) == [name]  # named by where the script made it
    loader = report["loaders"][name]
    assert loader["findings"][0]["rule"] == "input-bound"
    assert loader["measurements"]["batches"] == 32 and loader["measurements"]["epochs"] == 2
    assert loader["measurements"]["wait_fraction"] > 0.7  # ~40 ms of loading against a 2 ms step
    assert "loaderdoctor run train.py 3" in result.stderr and "input-bound" in result.stderr
    runs = load_runs(name=name)
    assert [(run.kind, run.findings[0]["rule"]) for run in runs] == [("run", "input-bound")]


def test_a_script_that_raises_is_shown_as_python_shows_it_and_still_summarized(tmp_path):
    _write(tmp_path, "boom.py", """\
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(torch.arange(40), batch_size=4)
        for number, batch in enumerate(loader):
            if number == 5:
                raise ValueError("the script's own bug")
        """)  # fmt: skip
    result = _run(["--no-history", "boom.py"], tmp_path)

    assert result.returncode == 1
    traceback = result.stderr[result.stderr.index("Traceback") :].splitlines()
    # As python shows it: the script's frame first, by its absolute path; no frame of runpy's or ours above it
    assert traceback[1] == f'  File "{tmp_path / "boom.py"}", line 7, in <module>'
    assert "ValueError: the script's own bug" in traceback
    assert "loader 'boom.py:4'" in result.stderr and "6 batches" in result.stderr
    assert "ended by an exception" in result.stderr


@pytest.mark.parametrize(("signum", "said"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_killed_or_interrupted_script_leaves_its_summary_and_no_process(tmp_path, signum, said):
    _write(tmp_path, "forever.py", """\
        import pathlib, time
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(torch.arange(10_000), batch_size=4, num_workers=2, persistent_workers=True)
        while True:
            for number, batch in enumerate(loader):
                time.sleep(0.005)
                if number == 20:
                    pathlib.Path("started").touch()
        """)  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--json", "out.json", "forever.py"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack (a hang below)
        # As in a terminal: a shell that starts pytest in the background without job control leaves SIGINT
        # ignored, a child inherits that, and python then ignores Ctrl-C (the script ran on, the test hung).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert (tmp_path / "started").exists(), process.communicate(timeout=30)
        process.send_signal(signum)
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # Show where it waits.
            process.send_signal(signal.SIGABRT)
            _, stderr = process.communicate(timeout=30)
            pytest.fail(f"run did not end within 60 s of {said}; its threads when aborted:\n{stderr[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signum
    assert f"ended by {said}" in stderr
    loader = json.loads((tmp_path / "out.json").read_text())["loaders"]["forever.py:5"]
    assert loader["measurements"]["batches"] >= 21
    assert loader["settings"]["num_workers"] == 2


def test_a_module_runs_as_python_m_runs_it(tmp_path):
    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/helpers.py", "BATCH = 5\n")
    _write(tmp_path, "pkg/train.py", """\
        import sys
        import torch
        from torch.utils.data import DataLoader
        from pkg.helpers import BATCH  # found from the working folder, as with python -m

        if __name__ == "__main__":
            print(sum(len(b) for b in DataLoader(torch.arange(50), batch_size=BATCH)), sys.argv[1:])
        """)  # fmt: skip
    result = _run(["--no-history", "--name", "job", "-m", "pkg.train", "--lr", "3"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "50 ['--lr', '3']\n"
    assert "loader 'job/train.py:7'" in result.stderr


DDP = """\
import time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

class Shards(Dataset):
    def __init__(self, read_s):
        self.read_s = read_s

    def __len__(self):
        return 192

    def __getitem__(self, index):
        time.sleep(self.read_s)
        return torch.ones(8)

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = Shards(0.03 if rank == 1 else 0.0005)  # rank 1 reads from slow storage
    loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset))
    grad = torch.zeros(1000)
    for batch in loader:
        time.sleep(0.01)
        dist.all_reduce(grad)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_two_gloo_ranks_name_the_rank_that_reads_slow_storage(tmp_path):
    _write(tmp_path, "ddp.py", DDP)
    result = _run(["--nproc-per-node", "2", "--json", "out.json", "ddp.py"], tmp_path, timeout=180)

    assert result.returncode == 0, result.stderr
    assert "rank 0 done" in result.stdout and "rank 1 done" in result.stdout
    report = json.loads((tmp_path / "out.json").read_text())
    site = f"ddp.py:{_line(DDP, 'loader = DataLoader')}"
    assert sorted(report["loaders"]) == [f"{site}/rank0", f"{site}/rank1"]
    slow = report["loaders"][f"{site}/rank1"]["findings"]
    straggler = next(f for f in slow if f["rule"] == "rank-straggler")
    assert straggler["evidence"]["rank"] == 1 and straggler["title"].startswith("rank 1 on ")
    assert straggler["evidence"]["ranks"] == [1] and straggler["evidence"]["hosts"] == [straggler["evidence"]["host"]]
    assert not [f for f in report["loaders"][f"{site}/rank0"]["findings"] if f["rule"] == "rank-straggler"]
    assert "rank-straggler" in result.stderr
    plan = report["loaders"][f"{site}/rank0"]["plan"]
    assert (plan["world_size"], plan["samples_per_rank"], plan["batches_per_rank"]) == (2, 96, 24)
    assert "DDP plan" in result.stderr
    assert {run.name for run in load_runs()} == {f"{site}/rank0", f"{site}/rank1"}


LIGHTNING = """\
import time
import torch
import lightning as L
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        time.sleep(0.005)
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
        return DataLoader(Slow(), batch_size=4)

if __name__ == "__main__":
    L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False).fit(Model())
    print("fit done")
"""


def test_a_lightning_script_is_watched_the_same_way(tmp_path):
    pytest.importorskip("lightning")
    _write(tmp_path, "fit.py", LIGHTNING)
    result = _run(["--no-history", "--json", "out.json", "fit.py"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("fit done\n")
    loader = json.loads((tmp_path / "out.json").read_text())["loaders"][f"fit.py:{_line(LIGHTNING, 'DataLoader(Slow')}"]
    assert loader["measurements"]["epochs"] == 2 and loader["measurements"]["batches"] == 32
    assert loader["findings"][0]["rule"] == "input-bound"  # 4 x 5 ms of loading, against a step of far less


def test_a_rank_killed_outright_passes_its_status_and_keeps_what_it_sent_as_its_epoch_ended(tmp_path):
    _write(tmp_path, "killed.py", """\
        import os, signal, time
        import torch
        from torch.utils.data import DataLoader

        for batch in DataLoader(torch.arange(40), batch_size=4):
            time.sleep(0.01)
        if os.environ["RANK"] == "1":
            # Rank 0 ends first: a rank the launcher ends while it summarizes is issue 33.6's (SIGTERM to ranks).
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGKILL)  # it says nothing at its end: what it sent at its epoch's stands
        """)  # fmt: skip
    tmpdir = tmp_path / "tmp"  # its own: another test's run may have a folder in the shared one meanwhile
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    result = _run(["--no-history", "--nproc-per-node", "2", "killed.py"], tmp_path, timeout=180, env=env)

    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    said = " ".join(result.stderr.split())
    assert "loader 'killed.py:5/rank0'" in said and "loader 'killed.py:5/rank1'" in said, said
    assert "rank 1 sent nothing at its end (it was killed by SIGKILL): its diagnosis covers its first" in said, said
    assert "ended by rank 1 failing" in said
    assert not [name for name in os.listdir(tmpdir) if name.startswith("loaderdoctor-run-")]


# The worker that loads sample 9 the first time (no file "died" yet) ends without a word.
DIES_ONCE = """\
import os, pathlib
from torch.utils.data import DataLoader, Dataset

class DiesOnce(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, index):
        if index == 9 and not pathlib.Path("died").exists():
            pathlib.Path("died").touch()
            os._exit(1)
        return index

"""
EVERY_SAMPLE_ONCE = "print(sorted(int(i) for batch in loader for i in batch) == list(range(32)))"


def test_guard_starts_forked_workers_again_for_a_script_only_fork_can_load(tmp_path):
    # Without `if __name__ == "__main__":` workers started with forkserver or spawn would run the script again:
    # the guard keeps fork and one worker, and after a death starts it again as it was (once).
    main = f"loader = DataLoader(DiesOnce(), batch_size=4, num_workers=1)\n{EVERY_SAMPLE_ONCE}\n"
    _write(tmp_path, "unguarded_main.py", DIES_ONCE + main)
    guarded = _run(["--no-history", "--guard", "unguarded_main.py"], tmp_path)
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout == "True\n"
    assert "start again as they were, once" in guarded.stderr


def test_guard_carries_a_script_past_a_worker_that_dies(tmp_path):
    # The guard may start its workers again with spawn, which imports the script: its main part under __main__.
    main = (
        'if __name__ == "__main__":\n'
        "    loader = DataLoader(DiesOnce(), batch_size=4, num_workers=1)\n"
        f"    {EVERY_SAMPLE_ONCE}\n"
    )
    _write(tmp_path, "dies.py", DIES_ONCE + main)
    plain = _run(["--no-history", "dies.py"], tmp_path)
    # Unguarded, the script ends with torch's own error: its RuntimeError, or (1 run in 10 or so here) the
    # ConnectionResetError or EOFError of a batch whose shared memory the dying worker was handing over; either way
    # the summary names the death.
    assert plain.returncode == 1, plain.stderr
    torchs = ("DataLoader worker", "ConnectionResetError", "\nEOFError")
    assert any(error in plain.stderr for error in torchs), plain.stderr
    assert "critical worker-crash" in plain.stderr, plain.stderr
    (tmp_path / "died").unlink()
    guarded = _run(["--no-history", "--guard", "dies.py"], tmp_path)
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout == "True\n"  # every sample, once, in order
    # The watch recorded on past the death, wherever torch raised it (in the loop's next() or, from its SIGCHLD
    # handler, inside the watch's own listener: test_watch_runs.py makes that happen).
    assert "8 batches in" in guarded.stderr
    assert "1 worker died (epoch 0, batch" in guarded.stderr and "the loop went on" in guarded.stderr
    assert "stopped recording" not in guarded.stderr
