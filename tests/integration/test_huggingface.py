"""Hugging Face and framework-made loaders with the real libraries on CPU (linear models, a few steps, no downloads):
an unmodified Trainer script under `loaderdoctor run` is diagnosed with its batch size and named by the Trainer's
method and the script's line; LoaderDoctorTrainerCallback diagnoses a Trainer's starved loader with gradient
accumulation and keeps it; an Accelerate script is watched once, named at its DataLoader line, and guarded; a
Lightning fit whose loaders Lightning re-makes (DDP's sampler) names them at the user's DataLoader lines."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from loaderdoctor.history.store import load_runs

pytestmark = [pytest.mark.workers, pytest.mark.timeout(180)]

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)


def _run(args: list[str], cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loaderdoctor", "run", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(textwrap.dedent(text))


def _line(text: str, needle: str) -> int:
    """The number of the line of `text` where `needle` is."""
    return next(n for n, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


def _loaders(folder: Path) -> dict[str, dict]:
    return json.loads((folder / "out.json").read_text())["loaders"]


# 4 samples x 10 ms of loading per batch in the main process, against a step of a few ms: input-bound by far.
TRAINER = """\
import time
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        time.sleep(0.01)
        return {"x": torch.randn(4), "labels": torch.randn(1)}

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

if __name__ == "__main__":
    args = TrainingArguments(output_dir="out", max_steps=10, use_cpu=True, report_to=[], per_device_train_batch_size=4,
                             dataloader_num_workers=0, logging_strategy="no", save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=Model(), args=args, train_dataset=Slow())
    trainer.train()
    print("train done")
"""


def test_an_unmodified_trainer_script_is_diagnosed_with_its_batch_size_named_by_the_trainers_method(tmp_path):
    pytest.importorskip("transformers")
    _write(tmp_path, "train.py", TRAINER)
    result = _run(["--no-history", "--json", "out.json", "train.py"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("train done\n")
    name = f"Trainer.get_train_dataloader (train.py:{_line(TRAINER, 'trainer.train()')})"
    loaders = _loaders(tmp_path)
    assert list(loaders) == [name], result.stderr  # the loader accelerate made of the Trainer's: watched once
    assert loaders[name]["recording"]["batch_size"] == 4
    assert loaders[name]["findings"][0]["rule"] == "input-bound"
    assert f"loader '{name}'" in result.stderr and "batch size 4" in result.stderr


class Pairs(torch.utils.data.Dataset):
    """16 samples for a linear model, each taking `read_s` to load."""

    def __init__(self, read_s: float) -> None:
        self.read_s = read_s

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(self.read_s)
        return {"x": torch.full((4,), float(index)), "labels": torch.ones(1)}


class Linear(torch.nn.Module):
    """A model as the Trainer takes one: a dict with the loss. (A tiny BERT's step takes 0.1-0.7 s on 2 cores
    shared with other tests: too close to any wait a test can afford.)"""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def test_the_trainer_callback_diagnoses_a_starved_loader_through_gradient_accumulation_and_keeps_it(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from loaderdoctor.huggingface import LoaderDoctorTrainerCallback

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=2, use_cpu=True, report_to=[], disable_tqdm=True,
        per_device_train_batch_size=4, gradient_accumulation_steps=2, dataloader_num_workers=0,
        logging_strategy="no", save_strategy="no",
    )  # fmt: skip
    callback = LoaderDoctorTrainerCallback("linear")
    # 4 samples x 50 ms of loading per batch, against a linear model's step of a few ms.
    transformers.Trainer(model=Linear(), args=args, train_dataset=Pairs(0.05), callbacks=[callback]).train()

    report = callback.reports["linear/train"]
    rec = report.recording
    assert report.findings[0].rule == "input-bound"
    assert [e.batches for e in rec.epochs] == [4, 4]  # 2 optimizer steps of 2 batches an epoch
    assert rec.batch_size == 4 and {b.samples for b in rec.batches} == {4}
    assert sum(b.wait_s for b in rec.batches) > 3 * sum(b.step_s for b in rec.batches)
    assert [(run.kind, run.name, run.findings[0]["rule"]) for run in load_runs()] == [
        ("huggingface", "linear/train", "input-bound")
    ]
    printed = capsys.readouterr().err
    assert "loader 'linear/train'" in printed and "input-bound" in printed


ACCELERATE = """\
import os, pathlib, time
import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator

class Slow(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, index):
        if index == 9 and os.environ.get("DIE") and not pathlib.Path("died").exists():
            pathlib.Path("died").touch()
            os._exit(1)  # the worker that loads sample 9 the first time ends without a word
        time.sleep(0.01)
        return torch.full((4,), float(index)), torch.randn(1)

if __name__ == "__main__":
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Slow(), batch_size=4, num_workers=int(os.environ.get("WORKERS", "0")))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen = []
    for x, y in loader:
        seen += [int(v) for v in x[:, 0]]
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print("every sample once:", sorted(seen) == list(range(32)))
"""


def test_an_accelerate_script_is_watched_once_named_at_its_dataloader_line(tmp_path):
    pytest.importorskip("accelerate")
    _write(tmp_path, "accel.py", ACCELERATE)
    result = _run(["--no-history", "--json", "out.json", "accel.py"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "every sample once: True\n"
    name = f"accel.py:{_line(ACCELERATE, 'loader = DataLoader(')}"
    loaders = _loaders(tmp_path)
    assert list(loaders) == [name], result.stderr  # the prepared loader, not the one it was made of besides
    assert loaders[name]["recording"]["batch_size"] == 4
    assert loaders[name]["measurements"]["batches"] == 8
    assert loaders[name]["findings"][0]["rule"] == "input-bound"


def test_an_accelerate_loader_is_guarded_past_a_worker_that_dies(tmp_path, monkeypatch):
    pytest.importorskip("accelerate")
    _write(tmp_path, "accel.py", ACCELERATE)
    monkeypatch.setenv("DIE", "1")
    monkeypatch.setenv("WORKERS", "1")
    result = _run(["--no-history", "--guard", "--json", "out.json", "accel.py"], tmp_path)

    assert (tmp_path / "died").exists()
    assert result.returncode == 0, result.stderr
    assert result.stdout == "every sample once: True\n"
    name = f"accel.py:{_line(ACCELERATE, 'loader = DataLoader(')}"
    assert list(_loaders(tmp_path)) == [name]
    assert "1 worker died (epoch 0, batch" in result.stderr and "the loop went on" in result.stderr


# strategy="ddp" on one device: Lightning re-makes each loader the user's hooks return, with a DistributedSampler.
LIGHTNING = """\
import time
import torch
import lightning as L
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 32

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

    def validation_step(self, batch, index):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(Slow(), batch_size=4)

    def val_dataloader(self):
        return DataLoader(Slow(), batch_size=8)

if __name__ == "__main__":
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, strategy="ddp", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=2)
    trainer.fit(Model())
    print("fit done")
"""


def test_loaders_lightning_makes_again_are_named_at_the_users_dataloader_lines(tmp_path):
    pytest.importorskip("lightning")
    _write(tmp_path, "fit.py", LIGHTNING)
    result = _run(["--no-history", "--json", "out.json", "fit.py"], tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("fit done\n")
    train = f"fit.py:{_line(LIGHTNING, 'DataLoader(Slow(), batch_size=4)')}"
    val = f"fit.py:{_line(LIGHTNING, 'DataLoader(Slow(), batch_size=8)')}"
    loaders = _loaders(tmp_path)
    assert set(loaders) == {train, val}, result.stderr
    assert loaders[train]["measurements"]["batches"] == 16  # 2 epochs of 8
    assert loaders[train]["findings"][0]["rule"] == "input-bound"


ACCELERATE_WATCHED = """\
import time
import torch
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
import loaderdoctor

class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.randn(4), torch.randn(1)

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(Slow(), batch_size=4))
watched = loaderdoctor.watch(loader, "accel-train", history=False)
for epoch in range(2):
    for x, y in watched:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
report = watched.close()
print(type(loader).__name__, report.recording.batch_size, report.findings[0].rule)
"""


def test_an_accelerate_prepared_loader_is_diagnosed_through_watch(tmp_path):
    # A job launched another way (accelerate launch, a cluster's own launcher) watches its prepared loader itself.
    pytest.importorskip("accelerate")
    _write(tmp_path, "watched.py", ACCELERATE_WATCHED)
    result = subprocess.run([sys.executable, "watched.py"], cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["DataLoaderShard", "4", "input-bound"]
