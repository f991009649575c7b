"""LoaderDoctorCallback and the trainer's logger: at the fit's end each loader's main figures over the whole fit
(rate, wait share, share of the host's limit) go to trainer.logger once, beside the figures it logs while the fit
runs."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from loaderdoctor.report import measurements
from shared_datasets import Busy

pytest.importorskip("lightning")

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

from loaderdoctor.lightning import LoaderDoctorCallback

pytestmark = pytest.mark.timeout(180)


class Linear(pl.LightningModule):
    """A linear model whose training step takes 5 ms more (a sleep, as an accelerator's step leaves the CPU free)."""

    def __init__(self, train: DataLoader) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)
        self.train_loader = train

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(0.005)
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return self.train_loader


def _fit(tmp_path: Path, callback: LoaderDoctorCallback, logger: bool) -> None:
    # 4 samples x 3 ms of loading in the main process against a 5 ms step: the loop waits about 2/3 of the time.
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        limit_train_batches=20,
        limit_val_batches=0,
        callbacks=[callback],
        logger=CSVLogger(tmp_path / "logs", name="fit") if logger else False,
        log_every_n_steps=5,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Linear(DataLoader(Busy(3.0), batch_size=4)))


def _logged(tmp_path: Path, key: str) -> list[float]:
    (path,) = (tmp_path / "logs").rglob("metrics.csv")
    with path.open() as file:
        return [float(row[key]) for row in csv.DictReader(file) if row.get(key)]


def test_the_fit_end_figures_go_to_the_trainers_logger_once_beside_the_running_ones(tmp_path):
    callback = LoaderDoctorCallback("starved", history=False)
    _fit(tmp_path, callback, logger=True)

    report = callback.reports["starved/train"]
    assert report.findings[0].rule == "input-bound"
    (rate,) = _logged(tmp_path, "loaderdoctor/train/batches_per_s")
    (wait,) = _logged(tmp_path, "loaderdoctor/train/wait_fraction")
    (share,) = _logged(tmp_path, "loaderdoctor/train/share_of_limit")
    # the report's own figures, as the report has them (the share of waiting moves with the machine's load: the
    # input-bound finding above is the verdict)
    measured = measurements(report.recording, report.limit)
    assert rate == pytest.approx(measured["batches_per_s"], rel=0.01) and rate > 0
    assert wait == pytest.approx(measured["wait_fraction"], abs=0.001) and 0.1 < wait <= 1.0
    assert share > 0
    assert len(_logged(tmp_path, "loaderdoctor/train_wait_fraction")) == 8  # every 5 of 40 batches, as before
