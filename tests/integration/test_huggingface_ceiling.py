"""LoaderDoctorTrainerCallback(ceiling=...) on real Hugging Face Trainers (CPU, a linear model, a second or two
each): a starved training's ceiling is measured far above its real rate through gradient accumulation, its
data-free steps are no batches of the run, the real stream is the stream without the ceiling less the batches the
data-free steps took the place of at their epochs' ends, ceiling_only ends train() cleanly with its report, and
accelerate's loader iterates the user's DataLoader again afterwards."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("transformers")

import transformers

from loaderdoctor.errors import UsageError
from loaderdoctor.huggingface import LoaderDoctorTrainerCallback

pytestmark = [pytest.mark.workers, pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(key, "1")


class Indexed(torch.utils.data.Dataset):
    """`n` samples for a linear model, each its own index, each taking `read_s` to load."""

    def __init__(self, n: int, read_s: float) -> None:
        self.n, self.read_s = n, read_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.read_s:
            time.sleep(self.read_s)
        return {"x": torch.full((4,), float(index)), "labels": torch.ones(1)}


class Stream(torch.utils.data.IterableDataset):
    """`n` samples in order, each its own index, each taking `read_s` to load: accelerate dispatches its batches
    (DataLoaderDispatcher), here from the one process."""

    def __init__(self, n: int, read_s: float) -> None:
        self.n, self.read_s = n, read_s

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(first, self.n, step):
            if self.read_s:
                time.sleep(self.read_s)
            yield {"x": torch.full((4,), float(index)), "labels": torch.ones(1)}


class Linear(torch.nn.Module):
    """A model as the Trainer takes one, noting the sample indices of each batch it trains on in `seen`."""

    def __init__(self, seen: list) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = seen

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append([int(v) for v in x[:, 0]])
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Epochs(transformers.TrainerCallback):
    """Notes each epoch's start in `seen`."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.seen.append("epoch")


def _train(
    tmp_path, callback, data, *, epochs: int = 1, accumulate: int = 1, workers: int = 0, steps: int = -1
) -> tuple:
    seen: list = []
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=epochs, max_steps=steps, use_cpu=True, report_to=[],
        disable_tqdm=True,
        per_device_train_batch_size=2, gradient_accumulation_steps=accumulate, dataloader_num_workers=workers,
        dataloader_persistent_workers=workers > 0, logging_strategy="no", save_strategy="no", seed=3,
    )  # fmt: skip
    callbacks = [Epochs(seen)] + ([callback] if callback is not None else [])
    trainer = transformers.Trainer(model=Linear(seen), args=args, train_dataset=data, callbacks=callbacks)
    try:
        trainer.train()
    finally:
        loader = trainer.callback_handler.train_dataloader
    return seen, loader


def _epochs(seen: list) -> list[list[list[int]]]:
    """The batches trained on in each epoch."""
    epochs: list[list[list[int]]] = []
    for item in seen:
        if item == "epoch":
            epochs.append([])
        else:
            epochs[-1].append(item)
    return epochs


def _real(batches: list[list[int]], before: list[int] | None = None) -> list[list[int]]:
    """The batches less those handed again (equal to the one just before them)."""
    out = []
    for batch in batches:
        if batch != before:
            out.append(batch)
        before = batch
    return out


def test_a_starved_training_has_a_ceiling_far_above_its_rate_through_gradient_accumulation(tmp_path):
    # 2 samples x 20 ms of loading per batch against a linear model's step: without loading the loop runs many
    # times faster. 9 data-free batches in three turns of 3 (after 6 batches, between four real turns of 5), within
    # one epoch of 36 batches (18 steps of 2).
    callback = LoaderDoctorTrainerCallback("starved", ceiling=9, history=False)
    seen, loader = _train(tmp_path, callback, Indexed(72, 0.02), accumulate=2)

    rec = callback.reports["starved/train"].recording
    ceiling = rec.ceiling
    assert ceiling is not None and ceiling.complete
    assert ceiling.data_free_steps == 9 and ceiling.trained_on_repeated_batches
    assert ceiling.speedup is not None and ceiling.speedup > 3
    batches = [batch for batch in seen if batch != "epoch"]
    assert len(batches) == 36  # the Trainer's count: the data-free batches took the place of 9 real ones
    assert len(_real(batches)) == 36 - 9
    assert [e.batches for e in rec.epochs] == [36 - 9]  # the run counts the real batches alone
    # Afterwards accelerate's loader holds and iterates the user's DataLoader again.
    assert type(loader.base_dataloader) is torch.utils.data.DataLoader
    loader.dataset.read_s = 0.0
    assert len(list(loader)) == 36


def test_the_real_stream_under_the_ceiling_is_the_stream_without_it_less_its_epochs_last_batches(tmp_path):
    # Epochs of 20 batches and turns over 6 + 4 x 5 + 9 deliveries: they run across the first epoch's end.
    plain, _ = _train(tmp_path, None, Indexed(40, 0.0), epochs=2)
    callback = LoaderDoctorTrainerCallback("stream", ceiling=9, history=False)
    measured, _ = _train(tmp_path, callback, Indexed(40, 0.0), epochs=2)

    plain_epochs, measured_epochs = _epochs(plain), _epochs(measured)
    assert [len(e) for e in measured_epochs] == [len(e) for e in plain_epochs] == [20, 20]
    free = 0
    last = None
    for plain_epoch, measured_epoch in zip(plain_epochs, measured_epochs, strict=True):
        real = _real(measured_epoch, last)
        last = measured_epoch[-1]
        assert real == plain_epoch[: len(real)]  # in order, nothing skipped or repeated before the epoch's end
        free += len(measured_epoch) - len(real)
    rec = callback.reports["stream/train"].recording
    # The turns' last batch of the first epoch, fetched ahead by accelerate and never trained on, is not counted.
    assert rec.ceiling is not None and rec.ceiling.data_free_steps == free == 8
    assert sum(e.batches for e in rec.epochs) == 40 - free
    assert rec.ceiling.kept_length == "the Hugging Face Trainer counted its epochs' batches first"


def test_ceiling_only_ends_the_training_once_measured_with_its_report_and_no_worker_left(tmp_path, capsys):
    callback = LoaderDoctorTrainerCallback("only", ceiling=9, ceiling_only=True, history=False)
    with pytest.raises(SystemExit) as ended:
        _train(tmp_path, callback, Indexed(400, 0.0), epochs=3, workers=2)

    assert ended.value.code == 0
    rec = callback.reports["only/train"].recording
    assert rec.ceiling is not None and rec.ceiling.data_free_steps == 9 and rec.ceiling.complete
    assert sum(e.batches for e in rec.epochs) < 100  # of the 3 x 200 the training would have taken
    assert "only (Hugging Face Trainer)" in capsys.readouterr().err
    # No worker is left: the autouse fixture fails the test otherwise.


def test_a_dispatched_stream_gets_its_turns_at_its_steps_and_its_real_stream_whole_across_epochs(tmp_path):
    # Epochs of 20 batches (40 samples, 2 per batch) that the ceiling's turns (6 + 4 x 5 + 9 deliveries) run across;
    # an epoch of a stream has no length to keep: its data-free steps make it longer, the 40 steps fewer real ones.
    plain, _ = _train(tmp_path, None, Stream(40, 0.0), steps=40)
    callback = LoaderDoctorTrainerCallback("stream", ceiling=9, history=False)
    measured, loader = _train(tmp_path, callback, Stream(40, 0.0), steps=40)

    assert type(loader).__name__ == "DataLoaderDispatcher"
    rec = callback.reports["stream/train"].recording
    assert rec.ceiling is not None and rec.ceiling.complete and rec.ceiling.data_free_steps == 9
    plain_batches = [batch for batch in plain if batch != "epoch"]
    batches = [batch for batch in measured if batch != "epoch"]
    assert len(plain_batches) == len(batches) == 40
    real = _real(batches)
    assert len(real) == 40 - 9 and real == plain_batches[: len(real)]
    assert len(_epochs(measured)[0]) > 20  # the first epoch took data-free steps too
    assert sum(e.batches for e in rec.epochs) == 40 - 9
    assert not hasattr(type(loader).__iter__, "__wrapped__")  # the dispatcher's class as it was


def test_a_dispatched_starved_stream_with_workers_and_ceiling_only_ends_measured(tmp_path, capsys):
    callback = LoaderDoctorTrainerCallback("only", ceiling=9, ceiling_only=True, history=False)
    with pytest.raises(SystemExit) as ended:
        _train(tmp_path, callback, Stream(4000, 0.02), accumulate=2, workers=2, steps=500)

    assert ended.value.code == 0
    rec = callback.reports["only/train"].recording
    assert rec.ceiling is not None and rec.ceiling.data_free_steps == 9 and rec.ceiling.complete
    # 40 ms of sleeping per batch in 2 workers, against a step of 2 to 5 ms (beside another test: at 10 ms of
    # loading a batch, a step slowed by the load left the ceiling 1.25x the real rate)
    assert rec.ceiling.speedup is not None and rec.ceiling.speedup > 2
    assert sum(e.batches for e in rec.epochs) < 100
    assert "only (Hugging Face Trainer)" in capsys.readouterr().err
    # No worker is left: the autouse fixture fails the test otherwise.


@pytest.mark.parametrize(
    "options",
    [{"ceiling": 2}, {"ceiling": "yes"}, {"ceiling": 2.5}, {"ceiling_only": True}, {"ceiling": 9, "ceiling_only": 1}],
)
def test_a_bad_ceiling_option_is_a_usage_error(options):
    with pytest.raises(UsageError):
        LoaderDoctorTrainerCallback(**options)
