"""A Hugging Face Trainer run by torchrun on two CPU processes (gloo), for test_huggingface_ranks.py: a linear model
on a stream (an IterableDataset, which accelerate dispatches from rank 0) or on a map-style dataset (each rank its
share), under LoaderDoctorTrainerCallback. Each rank writes what it trained on and what its callback measured to
rank<N>.json in the output folder, also when train() ends by the ceiling's exit.

    python -m torch.distributed.run --standalone --nproc-per-node 2 huggingface_ranks.py OUT stream|indexed
        [--ceiling N] [--only] [--straggler]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import transformers

from loaderdoctor.huggingface import LoaderDoctorTrainerCallback

READ_S = 0.004  # loading per sample: a starved training
STEPS = 60


class Stream(torch.utils.data.IterableDataset):
    """Samples 0, 1, 2... each its own index, each `READ_S` to load."""

    def __iter__(self):
        for index in range(100_000):
            time.sleep(READ_S)
            yield {"x": torch.full((4,), float(index)), "labels": torch.ones(1)}


class Indexed(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1_000

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(READ_S)
        return {"x": torch.full((4,), float(index)), "labels": torch.ones(1)}


class Linear(torch.nn.Module):
    """Notes the sample indices of each batch it trains on; a straggler's step takes 5 ms more."""

    def __init__(self, seen: list, straggler: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen, self.straggler = seen, straggler

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append([int(v) for v in x[:, 0]])
        if self.straggler:
            time.sleep(0.005)
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("data", choices=["stream", "indexed"])
    parser.add_argument("--ceiling", type=int, default=0)
    parser.add_argument("--only", action="store_true")
    parser.add_argument("--straggler", action="store_true")
    options = parser.parse_args()
    rank = int(os.environ["RANK"])
    seen: list = []
    callbacks = []
    if options.ceiling:
        callbacks.append(LoaderDoctorTrainerCallback("ranks", ceiling=options.ceiling, ceiling_only=options.only,
                                                     history=False))  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(options.out / "trainer"), use_cpu=True, ddp_backend="gloo", max_steps=STEPS,
        per_device_train_batch_size=4, report_to=[], save_strategy="no", logging_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    data = Stream() if options.data == "stream" else Indexed()
    model = Linear(seen, straggler=options.straggler and rank == 1)
    trainer = transformers.Trainer(model, args, train_dataset=data, callbacks=callbacks)
    ended = None
    try:
        trainer.train()
    except SystemExit as exit:
        ended = exit.code
        raise
    finally:
        written: dict = {"seen": seen, "ended": ended, "loader": type(trainer.train_dataset).__name__}
        for name, report in callbacks[0].reports.items() if callbacks else []:
            ceiling = report.recording.ceiling
            written.update(
                name=name,
                batches=[epoch.batches for epoch in report.recording.epochs],
                data_free_steps=ceiling.data_free_steps if ceiling else None,
                complete=ceiling.complete if ceiling else None,
                speedup=ceiling.speedup if ceiling else None,
                rules=[finding.rule for finding in report.findings],
                job={k: v for f in report.findings if f.rule == "job-ceiling" for k, v in f.evidence.items()},
            )
        (options.out / f"rank{rank}.json").write_text(json.dumps(written))


if __name__ == "__main__":
    sys.exit(main())
