"""LoaderDoctorCallback(ceiling=...) on real Lightning fits (CPU, a tiny model, a second or two each): a starved
fit's ceiling is measured far above its real rate, its data-free steps are no batches of the run, the real stream
is the one a fit without the ceiling sees (every epoch whole), ceiling_only ends the fit cleanly with its report,
and the fit's combined loader holds the user's DataLoader again afterwards."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

pytest.importorskip("lightning")

import lightning.pytorch as pl

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.lightning import LoaderDoctorCallback

pytestmark = pytest.mark.timeout(120)


class Slow(Dataset):
    """`n` samples, each its own index as a float, each taking `sleep_s` to load."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.full((8,), float(index))


class Stream(IterableDataset):
    """`n` samples, each its own index as a float, in order, each taking `sleep_s` to load (no length: Lightning
    fetches a batch ahead)."""

    def __init__(self, n: int, sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __iter__(self):
        for index in range(self.n):
            time.sleep(self.sleep_s)
            yield torch.full((8,), float(index))


class Seen(pl.LightningModule):
    """A linear model with a near-free step that notes the sample indices of every batch it trains on."""

    def __init__(self, train: DataLoader) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)
        self.train_loader = train
        self.seen: list[list[int]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append([int(v) for v in batch[:, 0]])
        return self.linear(batch).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self) -> DataLoader:
        return self.train_loader


def _trainer(callback: LoaderDoctorCallback | None, epochs: int) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        limit_val_batches=0,
        callbacks=[callback] if callback is not None else [],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )


def _loader(n: int, sleep_s: float, seed: int = 7) -> DataLoader:
    return DataLoader(Slow(n, sleep_s), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(seed))


def _real(seen: list[list[int]]) -> list[list[int]]:
    """The batches trained on, less those handed again (a batch equal to the one just before it)."""
    return [batch for n, batch in enumerate(seen) if n == 0 or batch != seen[n - 1]]


@pytest.mark.parametrize("sized", [True, False])
def test_a_starved_fit_has_a_ceiling_far_above_its_rate_and_data_free_steps_are_no_batches_of_its_run(sized):
    # 2 samples x 20 ms of loading against a step of well under a millisecond: without loading the loop runs many
    # times faster. 9 data-free steps in three turns of 3 between four real turns of 5.
    loader = _loader(24, 0.02) if sized else DataLoader(Stream(24, 0.02), batch_size=2)
    callback = LoaderDoctorCallback("starved", ceiling=9, history=False)
    model = Seen(loader)
    trainer = _trainer(callback, epochs=2)
    trainer.fit(model)

    rec = callback.reports["starved/train"].recording
    ceiling = rec.ceiling
    assert ceiling is not None and ceiling.complete
    assert ceiling.data_free_steps == 9
    assert ceiling.trained_on_repeated_batches
    assert ceiling.speedup is not None and ceiling.speedup > 3
    # The model trained on 9 batches more than the loader's 2 x 12; the run counts the loader's alone.
    assert len(model.seen) == 24 + 9
    assert [e.batches for e in rec.epochs] == [12, 12]
    assert sum(e.batches for e in rec.epochs) == 24
    # Each batch of the run waited for its loading, none is a data-free one (whose fetch takes about nothing); but
    # where Lightning fetches a batch ahead (no length), a step's wait is the next batch's fetch: the end of each
    # epoch's stream, and the first data-free batch of each of the 3 turns, take about nothing.
    assert sum(b.wait_s < 0.01 for b in rec.batches) <= (0 if sized else 2 + 3)
    # Afterwards the fit's loader is the user's again, and Lightning's count of an epoch's batches its own.
    assert trainer.fit_loop._combined_loader.flattened == [loader]
    assert trainer.train_dataloader is loader
    assert trainer.num_training_batches == (12 if sized else float("inf"))


@pytest.mark.parametrize("make", [lambda: _loader(24, 0.0), lambda: DataLoader(Stream(24), batch_size=2)])
def test_the_real_stream_under_the_ceiling_is_the_stream_without_it(make):
    # Epochs of 12 batches and turns over 1 + 5 + 4 x 5 + 12 deliveries: the turns run across the epochs' ends;
    # a seeded shuffle, and an iterable dataset.
    plain = Seen(make())
    _trainer(None, epochs=3).fit(plain)
    measured = Seen(make())
    callback = LoaderDoctorCallback("stream", ceiling=12, history=False)
    _trainer(callback, epochs=3).fit(measured)

    assert len(measured.seen) == len(plain.seen) + 12
    assert _real(measured.seen) == plain.seen  # every epoch whole: nothing skipped, nothing repeated
    rec = callback.reports["stream/train"].recording
    assert rec.ceiling is not None and rec.ceiling.data_free_steps == 12
    assert [e.batches for e in rec.epochs] == [12, 12, 12]


class OneCycle(Seen):
    """A schedule sized for the fit's steps, as Lightning's docs size a OneCycleLR: it raises once stepped past them."""

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def test_a_fit_whose_schedule_raises_past_its_steps_keeps_its_epochs_length():
    """Lengthened epochs would step its OneCycleLR past its end, a ValueError in the last epoch: the data-free steps
    take the place of their epoch's last real batches instead, and a warning says so."""
    plain = Seen(_loader(24, 0.0))
    _trainer(None, epochs=3).fit(plain)
    measured = OneCycle(_loader(24, 0.0))
    callback = LoaderDoctorCallback("onecycle", ceiling=9, history=False)
    with pytest.warns(LoaderDoctorWarning, match="OneCycleLR is sized for 36 steps"):
        _trainer(callback, epochs=3).fit(measured)

    assert len(measured.seen) == len(plain.seen) == 36  # the fit's steps, as planned
    real = _real(measured.seen)
    assert len(real) == 36 - 9
    epochs = [plain.seen[n * 12 : (n + 1) * 12] for n in range(3)]
    at = 0
    for epoch in epochs:  # each epoch's real batches: its first ones, in order
        kept = [batch for batch in real[at : at + 12] if batch in epoch]
        assert kept == epoch[: len(kept)]
        at += len(kept)
    assert at == len(real)
    rec = callback.reports["onecycle/train"].recording
    assert rec.ceiling is not None and rec.ceiling.data_free_steps == 9 and rec.ceiling.complete
    assert rec.ceiling.kept_length == "the fit's OneCycleLR is sized for 36 steps and raises past them"


@pytest.mark.timeout(60)
def test_ceiling_only_ends_the_fit_once_measured_with_its_report_and_no_worker_left(capsys):
    loader = DataLoader(Slow(400, 0.0), batch_size=2, num_workers=2, persistent_workers=True)
    callback = LoaderDoctorCallback("only", ceiling=9, ceiling_only=True, history=False)
    model = Seen(loader)
    trainer = _trainer(callback, epochs=5)
    with pytest.raises(SystemExit) as ended:
        trainer.fit(model)

    assert ended.value.code == 0
    # Start-up (2 workers + 5) and the turns: 4 real turns of 5 + 2 x 2 refilled, and 9 data-free steps.
    assert len(model.seen) == 7 + 4 * (5 + 4) + 9 < 200
    rec = callback.reports["only/train"].recording
    assert rec.ceiling is not None and rec.ceiling.data_free_steps == 9 and rec.ceiling.complete
    assert "only (Lightning fit)" in capsys.readouterr().err
    assert trainer.fit_loop._combined_loader.flattened == [loader]
    # No worker is left: the autouse fixture fails the test otherwise.


@pytest.mark.parametrize(
    "options",
    [{"ceiling": 2}, {"ceiling": "yes"}, {"ceiling": 2.5}, {"ceiling_only": True}, {"ceiling": 9, "ceiling_only": 1}],
)
def test_a_bad_ceiling_option_is_a_usage_error(options):
    with pytest.raises(UsageError):
        LoaderDoctorCallback(**options)
