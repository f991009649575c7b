"""The probe holds each batch until the next one is delivered, as `for batch in loader:` does: freed before next()
instead, a large batch at the top of the heap went back to the system and loading in the main process paid a
page fault for every page of the next one (~8% of the demo's rate, which a training loop does not pay)."""

from __future__ import annotations

import weakref

from torch.utils.data import DataLoader, Dataset

from loaderdoctor.loader.settings import LoaderSpec
from loaderdoctor.probe.measure import probe


class Batch:
    """A batch that can be watched for being freed."""


class Watching(Dataset):
    """Records, at the loading of each batch's first sample, whether the batch delivered before it is alive."""

    def __init__(self) -> None:
        # Lists, which the probe's copy of the dataset shares (loading in this process runs on a copy).
        self.delivered: list[weakref.ref] = []
        self.previous_alive: list[bool] = []

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        if index % 4 == 0 and self.delivered:
            self.previous_alive.append(self.delivered[-1]() is not None)
        return index


def test_the_previous_batch_is_alive_while_the_next_one_loads():
    dataset = Watching()

    def collate(samples: list[int]) -> Batch:
        batch = Batch()
        dataset.delivered.append(weakref.ref(batch))
        return batch

    spec = LoaderSpec.from_loader(DataLoader(dataset, batch_size=4, collate_fn=collate))
    rec = probe(spec, budget_s=0.2, epochs=2, step_ms=1)
    # Only an epoch's first batch may load with the one before freed (the epoch ended, as a loop's does).
    assert len(dataset.previous_alive) >= 10
    assert dataset.previous_alive.count(False) <= len(rec.epochs)
