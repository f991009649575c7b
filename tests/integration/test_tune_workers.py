"""tune() with real workers: it goes past the cores for I/O, and a trial that hangs is recorded, not waited on."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from loaderdoctor import tune
from loaderdoctor.cli import main
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.loader.workload import sleep_step
from loaderdoctor.probe.measuring import Measuring
from loaderdoctor.tap.watchdog import StallPolicy
from loaderdoctor.tune.measure import probe_measure
from loaderdoctor.tune.trial import VERDICTS

pytestmark = [pytest.mark.workers, pytest.mark.timeout(180)]

QUICK = StallPolicy(floor_s=2.0, multiple=20.0, first_batch_s=20.0, first_batch_idle_s=2.0, idle_window_s=1.0)


class WaitsOnStorage(Dataset):
    """Each sample waits 20 ms, as on a remote read, and computes nothing."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.02)
        return torch.full((4,), float(index))


class HangsInLaterWorkers(Dataset):
    """Loads at once, except in a worker numbered 2 or more, where it never returns."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> torch.Tensor:
        info = get_worker_info()
        if info is not None and info.id >= 2:
            time.sleep(3600)
        time.sleep(0.01)  # waiting, clearly: beside busy processes the climb still goes past the cores to 4
        return torch.full((4,), float(index))


class WholeStreamInEachWorker(IterableDataset):
    """A stream that ignores get_worker_info(): every worker yields all of it."""

    def __iter__(self):
        for index in range(64):
            time.sleep(0.002)
            yield torch.full((4,), float(index))


def make_io_loader() -> DataLoader:
    return DataLoader(WaitsOnStorage(), batch_size=4)


@pytest.mark.quiet
def test_loading_that_waits_on_io_is_given_more_workers_than_cores():
    report = tune(make_io_loader(), budget_s=20.0, max_workers=8, policy=QUICK)
    tuning = report.loaders["loader"]
    assert tuning.found and report.exit_status == 0
    assert tuning.settings.num_workers > tuning.limits.cores
    assert tuning.speedup is not None and tuning.speedup >= 3.0  # 8 waiting workers: about 8x
    assert tuning.seconds <= 20.0 * 1.5


@pytest.mark.quiet
def test_with_a_training_step_the_cheapest_settings_that_keep_up_are_chosen():
    # A batch takes a worker 80 ms and the step 40 ms: 2 workers keep up; 8 would be faster but only cost more.
    report = tune(make_io_loader(), budget_s=30.0, max_workers=8, step_ms=40.0, policy=QUICK)
    tuning = report.loaders["loader"]
    assert tuning.chosen.keeps_up
    assert 2 <= tuning.settings.num_workers <= 4
    assert all(trial.settings.num_workers <= 4 for trial in tuning.trials if trial.settings.backend == "process")


def test_a_trial_that_hangs_is_recorded_as_stalled_and_never_chosen():
    report = tune(
        DataLoader(HangsInLaterWorkers(), batch_size=4), budget_s=24.0, max_workers=4, quick=True, policy=QUICK
    )
    tuning = report.loaders["loader"]
    verdicts = {trial.settings.num_workers: trial.verdict for trial in tuning.trials if trial.phase != "baseline"}
    assert verdicts[4] == "stalled"
    assert tuning.chosen.verdict == "measured" and tuning.settings.num_workers <= 2


def test_workers_that_repeat_a_stream_are_never_chosen():
    report = tune(DataLoader(WholeStreamInEachWorker(), batch_size=4), budget_s=20.0, max_workers=2, quick=True)
    tuning = report.loaders["loader"]
    verdicts = {trial.settings.num_workers: trial.verdict for trial in tuning.trials if trial.phase != "baseline"}
    assert verdicts[2] == "other-data"
    assert tuning.settings.num_workers <= 1


def test_the_command_line_prints_every_trial_and_the_choice_as_json(tmp_path, capsys):
    target = tmp_path / "pipeline.py"
    target.write_text(
        "import time\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Waits(Dataset):\n"
        "    def __len__(self):\n        return 256\n"
        "    def __getitem__(self, index):\n        time.sleep(0.02)\n        return torch.zeros(4)\n"
        "def make():\n    return DataLoader(Waits(), batch_size=4)\n"
    )
    status = main(["tune", f"{target}:make", "--budget", "12", "--max-workers", "2", "--quick", "--json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    data = json.loads(captured.out)
    assert data["schema"] == "loaderdoctor.tune/1"
    loader = data["loaders"]["loader"]
    assert {"trials", "chosen", "baseline", "speedup", "snippet"} <= set(loader)
    assert loader["trials"][0]["phase"] == "baseline"
    assert all(trial["verdict"] in VERDICTS for trial in loader["trials"])
    assert loader["chosen"]["settings"]["num_workers"] >= 1


class Tiny(Dataset):
    """A sample that costs nothing, in a dataset of `size` samples."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), float(index))


@pytest.mark.quiet
def test_a_trial_measures_a_bounded_window_whatever_the_epochs_length():
    # 18,968 batches per epoch at a 5 ms step would take 95 s an epoch: a 2 s trial must not wait for one.
    step = sleep_step(5.0)
    settings = Settings(num_workers=2, persistent_workers=False)
    timings = {}
    for size in (16 * 4, 18_968 * 4):
        spec = LoaderSpec.from_loader(DataLoader(Tiny(size), batch_size=4))
        measure = probe_measure(Measuring(spec, step=step, policy=QUICK))
        started = time.monotonic()
        run = measure(settings, 2.0)
        timings[size] = time.monotonic() - started
        assert run.outcome == "completed" and run.batches_per_s > 0
    assert timings[18_968 * 4] < 15.0  # the trial's window, its start-ups and stopping; never the 95 s epoch
