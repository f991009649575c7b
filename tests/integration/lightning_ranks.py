"""A Lightning fit on two CPU processes (strategy "ddp": Lightning starts rank 1 as a second `python` of this
script), for test_trainer_ranks.py: a linear model on a starved map-style dataset under
LoaderDoctorCallback(ceiling=9), with --only ceiling_only too. Each rank writes what its callback measured to
rank<N>.json in the output folder, also when the fit ends by the ceiling's exit.

    python lightning_ranks.py OUT [--only]
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from ranks_written import Slow, write_rank
from torch.utils.data import DataLoader

from loaderdoctor.lightning import LoaderDoctorCallback


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
        write_rank(out / f"rank{trainer.global_rank}.json", callback.reports["ranks/train"], ended=ended)


if __name__ == "__main__":
    main()
