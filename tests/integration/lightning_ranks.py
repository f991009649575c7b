"""A Lightning fit on two CPU processes (strategy "ddp": Lightning starts rank 1 as a second `python` of this
script), for test_trainer_ranks.py: a linear model on a starved map-style dataset under
LoaderDoctorCallback(ceiling=9), with --only ceiling_only too. Each rank writes what its callback measured to
rank<N>.json in the output folder, also when the fit ends by the ceiling's exit.

    python lightning_ranks.py OUT [--only]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.lightning import LoaderDoctorCallback


class Slow(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.004)
        return torch.full((4,), float(index))


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Slow(), batch_size=4)


def main() -> None:
    out = Path(sys.argv[1])
    callback = LoaderDoctorCallback("ranks", ceiling=9, ceiling_only="--only" in sys.argv, history=False)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback])  # fmt: skip
    ended = None
    try:
        trainer.fit(Model())
    except SystemExit as exit:
        ended = exit.code
        raise
    finally:
        report = callback.reports["ranks/train"]
        ceiling = report.recording.ceiling
        written = {
            "ended": ended,
            "batches": sum(epoch.batches for epoch in report.recording.epochs),
            "data_free_steps": ceiling.data_free_steps if ceiling else None,
            "complete": ceiling.complete if ceiling else None,
            "rules": [finding.rule for finding in report.findings],
            "job": {k: v for f in report.findings if f.rule == "job-ceiling" for k, v in f.evidence.items()},
        }
        (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(written))


if __name__ == "__main__":
    main()
