"""Verify on a dataset that opens its file lazily, with workers started every epoch: the speedup counts each
epoch's start-up on both sides, as a training loop pays it (real worker processes)."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.loader.workload import sleep_step
from loaderdoctor.probe.measure import probe
from loaderdoctor.probe.measuring import Measuring
from loaderdoctor.probe.verify import verify
from loaderdoctor.recording.epochcost import EpochCost
from loaderdoctor.report import Finding
from shared_datasets import OpensLazily

pytestmark = [pytest.mark.workers, pytest.mark.quiet, pytest.mark.timeout(40)]

OPEN_S = 1.5  # each worker's start: far longer than an epoch's 12 batches of a 10 ms step
BATCHES = 12


def test_loading_in_this_process_does_not_spare_the_originals_workers_their_start_up():
    """The original (2 workers started every epoch) against num_workers=0, which check's search found for such a
    loader: measured in one process, in turns. A plain loop's truth is about 12x (an epoch of 0.13 s of steps
    behind a 1.5 s start, against the steps alone); when the in-process runs opened the user's dataset, the
    original's later workers inherited it open and the speedup read 3.0x."""
    dataset = OpensLazily(BATCHES * 4, open_s=OPEN_S)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=False, multiprocessing_context="fork")
    spec = LoaderSpec.from_loader(loader)
    before = probe(spec, budget_s=1.0, epochs=1, step=sleep_step(10))
    finding = Finding("worker-respawn", "critical", "respawn", {}, "", settings_change={"num_workers": 0})
    (v,) = verify(Measuring(spec, step=sleep_step(10)), before, [finding], [Settings(num_workers=0)], budget_s=16.0)
    assert v.speedup is not None and v.speedup >= 6.0, v.note
    assert dataset.handle is None  # the user's object was never opened in this process
    # The report's epoch line (batches over the rate): each epoch of the original starts workers that open the
    # file, so it takes OPEN_S at least (it read 0.44 s when the start-ups were spared).
    assert EpochCost(BATCHES, v.before, v.after, None).epoch_s >= OPEN_S
