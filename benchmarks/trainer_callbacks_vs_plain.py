"""The trainer callbacks' figures (read from Lightning's and the Hugging Face Trainer's step hooks) against what a
plain timer measures of the same fit: its rate, and its wait share.

Usage: python benchmarks/trainer_callbacks_vs_plain.py [--rounds N] [--steps N] [MODE ...]

Modes: `lightning` (LoaderDoctorCallback on a Lightning fit) and `huggingface` (LoaderDoctorTrainerCallback on a
Trainer's train(), gradient accumulation 1). The same fit each time: a linear model, a dataset whose samples each
take `read` ms to load in the main process (no workers: every wait is the loader's), and a step that computes for
about 5 ms (matrix products in the model's forward). Two loaders per round, in turns: a slow one (8 samples x 3 ms
a batch, input-bound) and a fast one (8 x 0.2 ms, compute-bound).

The plain figures come from a timer inside the same fit, with no help from loaderdoctor: the dataset's
__getitem__ adds its time to a counter (the loading, all of which happens in next() with no workers), and the
model's forward notes the first and last moment of the fit's steps. The plain rate is steps / (last - first), the
plain wait share is loading's time over that span. The callback's are `batches_per_s` and `wait_fraction` of its
report. The table gives each round's figures, the ratio callback / plain of the rate (goal: within 10%) and the
difference of the wait share in points (goal: within 10). It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset

import harness

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class Timed(Dataset):
    """Samples that take `read_s` each, the time counted."""

    def __init__(self, read_s: float, count: int) -> None:
        self.read_s = read_s
        self.count = count
        self.loading_s = 0.0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        end = started + self.read_s
        while time.perf_counter() < end:  # storage that keeps the core: the wait is the loader's own
            pass
        self.loading_s += time.perf_counter() - started
        return {"x": torch.randn(16), "labels": torch.randn(1)}


class StepClock:
    """The first and last moment of the fit's steps, and how many."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.steps = 0
        self.loading_at_first = 0.0

    def step(self, dataset: Timed) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first, self.loading_at_first = now, dataset.loading_s
        self.last = now
        self.steps += 1


WEIGHT = torch.randn(256, 256)


def _compute() -> None:
    x = torch.ones(64, 256)
    for _ in range(PASSES):
        x = torch.tanh(x @ WEIGHT)


PASSES = 1  # calibrated by main() to a step of about 5 ms


def plain_figures(clock: StepClock, dataset: Timed) -> tuple[float, float]:
    """Steps per second between the first and the last step's start, and loading's share of that span (the last
    step's own loading, before its start, counted; the first's, before the span, not)."""
    span = clock.last - (clock.first or clock.last)
    loading = dataset.loading_s - clock.loading_at_first
    return (clock.steps - 1) / span, loading / span


def lightning_round(read_s: float, steps: int) -> tuple[float, float, float, float]:
    import lightning.pytorch as pl

    from loaderdoctor.lightning import LoaderDoctorCallback

    dataset, clock = Timed(read_s, steps * 8), StepClock()

    class Linear(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch: dict, index: int) -> torch.Tensor:
            clock.step(dataset)
            _compute()
            return torch.nn.functional.mse_loss(self.layer(batch["x"]), batch["labels"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = LoaderDoctorCallback("bench", history=False)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])  # fmt: skip
    trainer.fit(Linear(), DataLoader(dataset, batch_size=8))
    m = callback.reports["bench/train"].to_dict()["measurements"]
    return (*plain_figures(clock, dataset), m["batches_per_s"], m["wait_fraction"])


def huggingface_round(read_s: float, steps: int) -> tuple[float, float, float, float]:
    import transformers

    from loaderdoctor.huggingface import LoaderDoctorTrainerCallback

    dataset, clock = Timed(read_s, steps * 8), StepClock()

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            clock.step(dataset)
            _compute()
            return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}

    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, num_train_epochs=1, use_cpu=True, report_to=[], disable_tqdm=True,
            per_device_train_batch_size=8, dataloader_num_workers=0, logging_strategy="no", save_strategy="no",
        )  # fmt: skip
        callback = LoaderDoctorTrainerCallback("bench", history=False)
        transformers.Trainer(model=Linear(), args=args, train_dataset=dataset, callbacks=[callback]).train()
    m = callback.reports["bench/train"].to_dict()["measurements"]
    return (*plain_figures(clock, dataset), m["batches_per_s"], m["wait_fraction"])


COLUMNS = [
    harness.Column("mode"),
    harness.Column("loader"),
    harness.Column("round"),
    harness.Column("plain b/s", fmt=".1f"),
    harness.Column("callback b/s", fmt=".1f"),
    harness.Column("callback / plain", fmt=".2f", key="ratio"),
    harness.Column("plain wait", fmt=".0%"),
    harness.Column("callback wait", fmt=".0%"),
    harness.Column("pts", fmt="+.1f"),
]


def main(argv: list[str] | None = None) -> None:
    global PASSES
    parser = harness.parser(__doc__, rounds=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("modes", nargs="*", default=["lightning", "huggingface"])
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    PASSES = harness.calibrated_passes(5.0)
    rounds = {"lightning": lightning_round, "huggingface": huggingface_round}
    table = harness.Table(COLUMNS, markdown=True)
    table.header()
    with harness.Results(__file__, args) as results:
        for mode in args.modes:
            for number in range(args.rounds):
                for loader, read_s in (("slow", 0.003), ("fast", 0.0002)):
                    rate, wait, their_rate, their_wait = rounds[mode](read_s, args.steps)
                    row = table.row(mode, loader, number + 1, rate, their_rate, their_rate / rate, wait, their_wait,
                                    (their_wait - wait) * 100)  # fmt: skip
                    results.add(**row)
            for loader in ("slow", "fast"):
                mine = [r for r in results.rows if r["mode"] == mode and r["loader"] == loader]
                results.figures[f"{mode}, {loader}: callback/plain rate"] = harness.median(r["ratio"] for r in mine)
                results.figures[f"{mode}, {loader}: wait points apart"] = harness.median(r["pts"] for r in mine)


if __name__ == "__main__":
    main()
