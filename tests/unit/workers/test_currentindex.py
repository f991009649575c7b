"""The slots where workers say which dataset index they are loading (workers/currentindex.py), and the samples that
killed a worker before, never loaded again under on_sample_error="skip" (guard/samples.py)."""

from __future__ import annotations

import pickle

import pytest
import torch

from loaderdoctor.guard.samples import GuardedSamples, Request
from loaderdoctor.workers.currentindex import InHand


def test_a_worker_writes_its_own_slot_and_the_main_process_reads_it(tmp_path):
    slots = InHand(str(tmp_path), 3)
    assert [slots.read(i) for i in range(3)] == [None, None, None]
    in_worker = pickle.loads(pickle.dumps(slots))  # only the path travels
    in_worker.attach(1)
    in_worker.loading(123_456_789_012)
    assert [slots.read(i) for i in range(3)] == [None, 123_456_789_012, None]
    in_worker.done()
    assert slots.read(1) is None
    for nameless in ("a key, not an index", 2**63 + 5, -(2**63)):
        in_worker.loading(nameless)  # nothing to name it by: the slot says none, and loading goes on
        assert slots.read(1) is None
    in_worker.loading(torch.tensor(7))
    assert slots.read(1) == 7


def test_a_worker_starting_clears_what_an_earlier_one_left(tmp_path):
    slots = InHand(str(tmp_path), 2)
    ended = pickle.loads(pickle.dumps(slots))
    ended.attach(0)
    ended.loading(5)  # ended mid-sample (an epoch left early): its slot still says 5
    pickle.loads(pickle.dumps(slots)).attach(0)  # the next epoch's worker 0
    assert slots.read(0) is None


def test_the_main_process_keeps_no_slot(tmp_path):
    slots = InHand(str(tmp_path), 2)
    slots.loading(7)  # never attached: nothing written, nothing mapped
    assert slots.read(0) is None and slots.read(1) is None
    assert slots.read(5) is None  # past the slots


class Batched:
    """A dataset that loads whole batches (torch calls __getitems__), recording what it was asked."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        self.asked.append(index)
        return index

    def __getitems__(self, indices: list[int]) -> list[int]:
        self.asked.extend(indices)
        return list(indices)


def test_a_killer_is_never_loaded_again_by_any_path(tmp_path):
    dataset = Batched()
    samples = GuardedSamples(dataset, str(tmp_path / "reports.jsonl"), killers={5: "killed by signal 11"})
    assert samples.__getitems__(Request([4, 5, 6], (0, 1))) == [4, 6, 6]  # replaced, as one that raised
    assert samples[Request(torch.tensor(5), (0, 2))] == 6  # whatever the index's type
    assert 5 not in dataset.asked
    assert samples.__getitems__(Request([1, 2], (0, 3))) == [1, 2]  # batches without one load whole


@pytest.mark.parametrize("index", [5, torch.tensor(5)])
def test_the_killer_is_reported_as_skipped(tmp_path, index):
    report = tmp_path / "reports.jsonl"
    samples = GuardedSamples(Batched(), str(report), killers={5: "killed by signal 11"})
    samples[Request(index, (0, 0))]
    assert '"error_type": "KilledItsWorker"' in report.read_text()


def test_a_workers_fetcher_notes_each_index_while_it_loads_it_and_nothing_between(tmp_path, monkeypatch):
    """NotingWorkerInit, as a worker runs it: torch's map-style fetcher (in that process) notes the index of each
    sample while the user's dataset loads it; the dataset, the batch and the user's worker_init_fn are untouched."""
    from torch.utils.data._utils import fetch
    from torch.utils.data._utils.collate import default_collate

    from loaderdoctor.workers.currentindex import NotingWorkerInit

    monkeypatch.setattr(fetch._MapDatasetFetcher, "fetch", fetch._MapDatasetFetcher.fetch)  # put back after
    slots = InHand(str(tmp_path), 2)
    seen: list[tuple[int, int | None]] = []

    class Squares:
        def __getitem__(self, index):
            seen.append((index, slots.read(1)))
            return index * index

    users: list[int] = []
    pickle.dumps(NotingWorkerInit(slots, None))  # spawn hands it to each worker
    hook = NotingWorkerInit(pickle.loads(pickle.dumps(slots)), users.append)  # the worker's copy of the slots
    hook(1)  # in worker 1, as it starts
    assert users == [1]
    fetcher = fetch._MapDatasetFetcher(Squares(), True, default_collate, False)
    assert fetcher.fetch([3, 5]).tolist() == [9, 25]
    assert seen == [(3, 3), (5, 5)] and slots.read(1) is None  # noted while loading each, none between
    single = fetch._MapDatasetFetcher(Squares(), False, lambda sample: sample, False)
    assert single.fetch(7) == 49 and seen[-1] == (7, 7)


def test_a_dataset_that_loads_a_batch_at_once_names_no_index(tmp_path, monkeypatch):
    from torch.utils.data._utils import fetch
    from torch.utils.data._utils.collate import default_collate

    from loaderdoctor.workers.currentindex import NotingWorkerInit

    monkeypatch.setattr(fetch._MapDatasetFetcher, "fetch", fetch._MapDatasetFetcher.fetch)
    slots = InHand(str(tmp_path), 1)
    read: list[int | None] = []

    class Rows:
        def __getitems__(self, indices):
            read.append(slots.read(0))
            return list(indices)

    NotingWorkerInit(pickle.loads(pickle.dumps(slots)), None)(0)
    assert fetch._MapDatasetFetcher(Rows(), True, default_collate, False).fetch([1, 2]).tolist() == [1, 2]
    assert read == [None]
