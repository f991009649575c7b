"""LoaderDoctorCallback on real Lightning fits (CPU, a tiny model, a few seconds each): a starved train loader is
input-bound, kept in the history and logged; a healthy one is not; train and val are measured apart, with a
validation run set aside from the training loader's wait; workers are found; and a TARGET may return a
LightningDataModule."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from shared_datasets import Busy

pytest.importorskip("lightning")

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

from loaderdoctor.cli import main
from loaderdoctor.history.store import load_runs
from loaderdoctor.lightning import LoaderDoctorCallback
from loaderdoctor.recording.record import wait_fraction

pytestmark = pytest.mark.timeout(180)


class Tiny(pl.LightningModule):
    """A linear model whose training and validation steps take `train_step_s` and `val_step_s` more (a sleep, as
    an accelerator's step leaves the CPU free)."""

    def __init__(self, train: DataLoader, val: DataLoader | None, train_step_s: float, val_step_s: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)
        self.loaders = (train, val)
        self.train_step_s, self.val_step_s = train_step_s, val_step_s

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(self.train_step_s)
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        time.sleep(self.val_step_s)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return self.loaders[0]

    def val_dataloader(self) -> DataLoader | list:
        return self.loaders[1] if self.loaders[1] is not None else []


def _fit(
    tmp_path: Path,
    callback: LoaderDoctorCallback,
    train: DataLoader,
    val: DataLoader | None = None,
    *,
    train_step_s: float,
    val_step_s: float = 0.0,
    epochs: int = 3,
    logger: bool = False,
    **trainer_options,
) -> LoaderDoctorCallback:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        limit_train_batches=20,
        limit_val_batches=4 if val is not None else 0,
        callbacks=[callback],
        logger=CSVLogger(tmp_path / "logs", name="fit") if logger else False,
        log_every_n_steps=5,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        **trainer_options,
    )
    trainer.fit(Tiny(train, val, train_step_s, val_step_s))
    return callback


def _metrics(tmp_path: Path) -> list[dict[str, str]]:
    (path,) = (tmp_path / "logs").rglob("metrics.csv")
    with path.open() as file:
        return list(csv.DictReader(file))


def test_a_starved_train_loader_is_input_bound_kept_in_the_history_and_logged(tmp_path, capsys):
    # 4 samples x 3 ms of loading in the main process against a 5 ms step: the loop waits about 2/3 of the time.
    callback = LoaderDoctorCallback("starved")
    _fit(tmp_path, callback, DataLoader(Busy(3.0), batch_size=4), train_step_s=0.005, logger=True)

    report = callback.reports["starved/train"]
    assert report.findings[0].rule == "input-bound"
    assert wait_fraction(report.recording) > 0.3
    assert report.recording.epochs and len(report.recording.epochs) == 3
    assert sum(e.batches for e in report.recording.epochs) == 60

    runs = load_runs(kind="lightning")
    assert [run.name for run in runs] == ["starved/train"]
    assert runs[0].findings[0]["rule"] == "input-bound"

    rows = _metrics(tmp_path)
    waits = [float(r["loaderdoctor/train_wait_fraction"]) for r in rows if r.get("loaderdoctor/train_wait_fraction")]
    rates = [float(r["loaderdoctor/train_batches_per_s"]) for r in rows if r.get("loaderdoctor/train_batches_per_s")]
    assert len(waits) == len(rates) == 12  # every 5 of 60 batches
    assert all(0.0 <= w <= 1.0 for w in waits)
    assert sum(waits) / len(waits) > 0.3
    assert all(r > 0 for r in rates)

    printed = capsys.readouterr().err
    assert "loader 'starved/train'" in printed
    assert "input-bound" in printed


def test_a_healthy_train_loader_gets_no_warning(tmp_path):
    callback = LoaderDoctorCallback("healthy", history=False)
    _fit(tmp_path, callback, DataLoader(Busy(0.0), batch_size=4), train_step_s=0.04, epochs=2)

    report = callback.reports["healthy/train"]
    assert not [f for f in report.findings if f.severity in ("critical", "warning")], report.findings
    assert load_runs() == []


def test_train_and_val_are_recorded_apart_and_validation_is_no_wait_for_training_data(tmp_path):
    # Validation twice an epoch (after 10 training batches and at the epoch's end), 4 batches of 60 ms each: it
    # is neither the training loader's wait nor its step. The sanity check's batches are not counted.
    callback = LoaderDoctorCallback("apart", history=False)
    train, val = DataLoader(Busy(0.0), batch_size=4), DataLoader(Busy(0.0, 64), batch_size=8)
    _fit(tmp_path, callback, train, val, train_step_s=0.02, val_step_s=0.06, epochs=2, val_check_interval=0.5)

    assert set(callback.reports) == {"apart/train", "apart/val"}
    train_rec = callback.reports["apart/train"].recording
    val_rec = callback.reports["apart/val"].recording
    assert [e.batches for e in train_rec.epochs] == [20, 20]
    assert [e.batches for e in val_rec.epochs] == [4, 4, 4, 4]
    assert train_rec.step_s == pytest.approx(0.02, abs=0.015)
    assert val_rec.step_s == pytest.approx(0.06, abs=0.03)
    # Validation counted as the training loader's wait would be about 1 s of a 2 s fit (a fraction near 0.45, and
    # one wait of 240 ms); loading Busy(0.0) in the main process beside another test's load is a few ms a batch.
    assert max(b.wait_s for b in train_rec.batches if b.index > 0) < 0.1
    assert wait_fraction(train_rec) < 0.2
    # Quiet, no finding; beside another test's load, main-process loading can reach a warning's few percent.
    assert ("input-bound", "critical") not in [(f.rule, f.severity) for f in callback.reports["apart/train"].findings]


class Corrupt(Busy):
    """Sample 50 raises."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == 50:
            raise ValueError("sample 50 is corrupt")
        return super().__getitem__(index)


def test_a_fit_that_a_sample_ends_is_diagnosed_and_kept(tmp_path):
    callback = LoaderDoctorCallback("corrupt")
    with pytest.raises(ValueError, match="sample 50 is corrupt"):
        _fit(tmp_path, callback, DataLoader(Corrupt(0.0), batch_size=4), train_step_s=0.005)

    report = callback.reports["corrupt/train"]
    assert [(e.epoch, e.batch, e.error_type) for e in report.recording.sample_errors] == [(0, 12, "ValueError")]
    assert report.findings[0].rule == "sample-errors"
    assert [run.name for run in load_runs(kind="lightning")] == ["corrupt/train"]


@pytest.mark.workers
def test_the_workers_of_each_loader_are_found_and_ended(tmp_path):
    callback = LoaderDoctorCallback("workers", history=False)
    train = DataLoader(Busy(1.0), batch_size=4, num_workers=2, persistent_workers=True)
    val = DataLoader(Busy(0.0, 64), batch_size=8, num_workers=1)
    _fit(tmp_path, callback, train, val, train_step_s=0.005, epochs=2)

    train_pids = [e.worker_pids for e in callback.reports["workers/train"].recording.epochs]
    val_pids = [e.worker_pids for e in callback.reports["workers/val"].recording.epochs]
    assert len(train_pids[0]) == 2 and train_pids[1] == train_pids[0]  # persistent: the same two
    assert [len(pids) for pids in val_pids] == [1, 1] and val_pids[0] != val_pids[1]  # started for each run
    assert not set(train_pids[0]) & {pid for pids in val_pids for pid in pids}


DATAMODULE = """
import torch
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as pl

CALLS = []


class Data(pl.LightningDataModule):
    def prepare_data(self):
        CALLS.append("prepare_data")

    def setup(self, stage):
        CALLS.append(f"setup:{stage}")
        self.train_set = TensorDataset(torch.randn(256, 8))
        self.val_set = TensorDataset(torch.randn(64, 8))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)

    def teardown(self, stage):
        CALLS.append(f"teardown:{stage}")


class TrainOnly(Data):
    def val_dataloader(self):
        return []


def make():
    return Data()


def make_train_only():
    return TrainOnly()
"""


def test_a_datamodule_target_is_checked_as_its_train_and_val_loaders(tmp_path, monkeypatch, capsys):
    (tmp_path / "dm_loaders.py").write_text(DATAMODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        status = main(["check", "dm_loaders.py:make", "--budget", "10", "--json", "--no-history"])
        report = json.loads(capsys.readouterr().out)
        assert status in (0, 1)
        assert list(report["loaders"]) == ["train", "val"]
        calls = sys.modules["dm_loaders"].CALLS
        assert calls == ["prepare_data", "setup:fit", "teardown:fit"]

        from loaderdoctor.targets.resolve import resolve

        with resolve("dm_loaders.py:make_train_only") as resolved:
            assert list(resolved.loaders) == ["train"]
    finally:
        sys.modules.pop("dm_loaders", None)


def test_a_plain_target_does_not_import_lightning(tmp_path):
    (tmp_path / "plain_loaders.py").write_text(
        textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def make():
            return DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4)
        """)
    )
    code = (
        "import sys; from loaderdoctor.targets.resolve import resolve; "
        "resolve('plain_loaders.py:make').close(); print('lightning' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"


def test_a_datamodule_given_to_check_in_python_and_its_mistakes():
    from torch.utils.data import TensorDataset

    from loaderdoctor.errors import UsageError
    from loaderdoctor.targets.resolve import resolve_any

    made = pl.LightningDataModule.from_datasets(
        train_dataset=TensorDataset(torch.zeros(16, 2)), val_dataset=TensorDataset(torch.zeros(8, 2)), batch_size=4
    )
    with resolve_any(made, "check") as resolved:
        assert list(resolved.loaders) == ["train", "val"]
        assert resolved.workload.val is resolved.loaders["val"]

    class Broken(pl.LightningDataModule):
        def setup(self, stage: str) -> None:
            raise FileNotFoundError("no such file: /data/train.csv")

        def train_dataloader(self) -> DataLoader:
            raise AssertionError("never called")

    with pytest.raises(UsageError) as broken:
        resolve_any(Broken(), "check")
    assert "Broken.setup('fit')" in broken.value.message
    assert "/data/train.csv" in broken.value.message

    with pytest.raises(UsageError) as no_train:
        resolve_any(pl.LightningDataModule(), "check")
    assert "defines no train_dataloader()" in no_train.value.message
