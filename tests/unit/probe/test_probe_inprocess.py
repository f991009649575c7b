"""probe() on loaders without workers (in this process, fast), and pickled_bytes() of what workers receive."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from loaderdoctor.errors import UsageError
from loaderdoctor.loader.pickling import pickled_bytes
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.probe.measure import ProbeProgress, probe
from loaderdoctor.recording.rates import interval_s
from loaderdoctor.recording.record import SampleError, wait_fraction
from loaderdoctor.tap.watchdog import StallPolicy
from shared_datasets import PlusMinus

MB = 10**6


class Blocking(PlusMinus):
    """PlusMinus whose item `stuck_at` blocks (until interrupted, or 5 s at most)."""

    def __init__(self, n: int, stuck_at: int) -> None:
        super().__init__(n)
        self.stuck_at = stuck_at
        self.never = threading.Event()

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.stuck_at:
            self.never.wait(5.0)
        return super().__getitem__(index)


class _CountingIterator:
    def __init__(self, n: int, bad: int) -> None:
        self.i, self.n, self.bad = 0, n, bad

    def __next__(self) -> int:
        i = self.i
        if i >= self.n:
            raise StopIteration
        self.i += 1
        if i == self.bad:
            raise ValueError(f"bad item {i}")
        return i


class Counting(IterableDataset):
    """0..n-1, raising ValueError instead of item `bad`, and going on after it."""

    def __init__(self, n: int = 10, bad: int = 4) -> None:
        self.n, self.bad = n, bad

    def __iter__(self) -> _CountingIterator:
        return _CountingIterator(self.n, self.bad)


class Locked(Dataset):
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return index


class Holding(Dataset):
    def __init__(self, data: object) -> None:
        self.data = data

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return index


def _spec(dataset, **loader_kwargs) -> LoaderSpec:
    return LoaderSpec.from_loader(DataLoader(dataset, **loader_kwargs))


# map-style


def test_sample_errors_are_recorded_and_the_run_goes_on():
    rec = probe(_spec(PlusMinus(20, bad=(3, 11)), batch_size=2), budget_s=10.0, epochs=1)
    assert rec.sample_errors == [
        SampleError(epoch=0, batch=1, index=3, error_type="ValueError", message="bad sample 3"),
        SampleError(epoch=0, batch=5, index=11, error_type="ValueError", message="bad sample 11"),
    ]
    assert [b.index for b in rec.batches] == [0, 2, 3, 4, 6, 7, 8, 9]
    assert rec.outcome == "completed"
    assert rec.epochs[0].ended == "exhausted"
    assert rec.epochs[0].batches == 8
    assert rec.batches[0].nbytes == 2 * 2 * 4  # two samples of two float32
    assert rec.batches[0].samples == 2


def test_every_bad_sample_of_one_batch_is_recorded():
    rec = probe(_spec(PlusMinus(8, bad=(4, 5)), batch_size=4), budget_s=10.0, epochs=1)
    assert [(e.batch, e.index) for e in rec.sample_errors] == [(1, 4), (1, 5)]
    assert len(rec.batches) == 1


def test_a_loader_whose_every_batch_fails_is_ended_as_crashed():
    rec = probe(_spec(PlusMinus(80, bad=tuple(range(80))), batch_size=1), budget_s=10.0, epochs=2)
    assert rec.outcome == "crashed"
    assert len(rec.sample_errors) == 50
    assert rec.error.startswith("50 batches in a row failed; the last: dataset[49] raised ValueError")
    assert [e.ended for e in rec.epochs] == ["error"]
    assert rec.batches == []


def test_epochs_and_step_are_recorded():
    progress: list[ProbeProgress] = []
    rec = probe(_spec(PlusMinus(20), batch_size=4), budget_s=10.0, epochs=2, step_ms=1, progress=progress.append)
    assert [(e.epoch, e.batches, e.ended) for e in rec.epochs] == [(0, 5, "exhausted"), (1, 5, "exhausted")]
    assert all(e.first_batch_s is not None and e.first_batch_s > 0 for e in rec.epochs)
    assert all(e.worker_pids == [] for e in rec.epochs)
    assert 0.001 <= rec.step_s < 0.1
    assert all(b.step_s >= 0.001 for b in rec.batches)
    assert wait_fraction(rec) is not None
    assert len(rec.iterators) == 2
    assert (rec.batches_per_epoch, rec.dataset_len, rec.dataset, rec.batch_size) == (5, 20, "PlusMinus", 4)
    assert rec.iterable is False
    assert rec.start_method is None
    assert rec.settings == Settings()
    assert rec.worker_samples == []
    assert rec.wall_s >= sum(b.step_s for b in rec.batches)
    # One report as each epoch starts (its workers may take a while), then one per batch.
    assert [p.batches for p in progress] == [0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10]
    assert progress[-1].epoch == 1


class SlowToOpen(IterableDataset):
    """Its iterator takes 0.3 s to create (torch creates it at iter() without workers), then yields 4 items."""

    def __iter__(self):
        time.sleep(0.3)
        return iter(range(4))


def test_an_epochs_wall_time_counts_from_iter_as_its_first_batch_does():
    rec = probe(_spec(SlowToOpen(), batch_size=2), budget_s=10.0, epochs=1)
    (epoch,) = rec.epochs
    assert epoch.first_batch_s >= 0.3
    assert epoch.wall_s >= epoch.first_batch_s


def test_no_step_leaves_step_s_unset():
    rec = probe(_spec(PlusMinus(4), batch_size=2), budget_s=10.0, epochs=1)
    assert rec.step_s is None
    assert all(b.step_s >= 0.0 for b in rec.batches)  # the loop's own time only: releasing the last batch


class SlowToFree:
    """A batch whose release takes 30 ms, as freeing a large one does (64 MB from shared memory: 15 ms)."""

    def __del__(self) -> None:
        time.sleep(0.03)


def test_releasing_the_last_batch_counts_in_the_loops_time_as_a_training_loop_pays_it():
    loader_spec = _spec(PlusMinus(12), batch_size=1, collate_fn=lambda samples: SlowToFree())
    rec = probe(loader_spec, budget_s=10.0, epochs=1)
    assert rec.step_s is None  # no training step: the release is the loop's own time, not a step's
    steady = [b for b in rec.batches if b.index > 0]
    # The batch delivered before each of these was released after next() returned: 30 ms each, which a plain
    # `for batch in loader:` pays too. Uncounted, the loop's interval would be a fraction of a millisecond.
    assert all(b.step_s >= 0.025 for b in steady)
    assert interval_s(rec) >= 0.025


def test_the_budget_ends_a_long_epoch():
    rec = probe(_spec(PlusMinus(100_000), batch_size=1), budget_s=0.3, epochs=1, step_ms=2)
    assert rec.epochs[0].ended == "time"
    assert 10 < len(rec.batches) <= 151  # each batch takes at least its 2 ms step
    assert rec.wall_s < 1.5


def test_the_budget_is_shared_between_epochs():
    rec = probe(_spec(PlusMinus(100_000), batch_size=1), budget_s=0.3, epochs=3, step_ms=2)
    assert [e.ended for e in rec.epochs] == ["time", "time", "time"]
    assert all(0 < e.wall_s < 0.5 for e in rec.epochs)
    assert all(e.batches > 0 for e in rec.epochs)
    assert rec.wall_s < 1.5


def test_other_settings_than_the_loaders_own():
    spec = _spec(PlusMinus(6), batch_size=3)
    rec = probe(spec, Settings(pin_memory=False), budget_s=10.0, epochs=1)
    assert rec.settings == Settings()
    assert len(rec.batches) == 2


@pytest.mark.parametrize(("kwargs", "words"), [({"epochs": 0}, "epochs must be"), ({"budget_s": 0}, "budget")])
def test_bad_arguments_are_usage_errors(kwargs, words):
    with pytest.raises(UsageError, match=words):
        probe(_spec(PlusMinus(2)), **kwargs)


def test_a_stall_in_this_process_is_interrupted_and_located():
    policy = StallPolicy(floor_s=0.05, multiple=1.0, first_batch_s=1.0)
    rec = probe(_spec(Blocking(10, stuck_at=5), batch_size=1), budget_s=10.0, epochs=1, policy=policy)
    assert rec.outcome == "stalled"
    assert rec.epochs[0].ended == "stall"
    assert len(rec.batches) == 5
    assert rec.stall.batch == 5
    assert rec.stall.waited_s < 2.0
    assert rec.stall.reason.startswith("no batch for")
    (stack,) = rec.stall.stacks
    assert stack.stuck_frame.file == __file__
    assert stack.stuck_frame.function == "__getitem__"


# iterable


def test_an_iterable_dataset():
    rec = probe(_spec(Counting(10, bad=4), batch_size=2), budget_s=10.0, epochs=1)
    assert rec.iterable is True
    assert rec.sample_errors == [
        SampleError(epoch=0, batch=2, index=None, error_type="ValueError", message="bad item 4")
    ]
    assert [b.samples for b in rec.batches] == [2, 2, 2, 2, 1]  # [0,1] [2,3] fails [5,6] [7,8] [9]
    assert rec.batches_per_epoch is None
    assert rec.dataset_len is None
    assert rec.outcome == "completed"


# pickled_bytes


def test_an_unpicklable_dataset_is_a_usage_error_naming_it():
    with pytest.raises(UsageError) as raised:
        pickled_bytes(_spec(Locked()), "spawn")
    message = raised.value.message
    assert "the loader's dataset (Locked) cannot be pickled" in message
    assert "'spawn'" in message
    assert "lock" in message
    assert "lazily inside the worker" in raised.value.hint


def test_an_unpicklable_collate_fn_is_named_too():
    with pytest.raises(UsageError, match=r"the loader's collate_fn \(function\) cannot be pickled"):
        pickled_bytes(_spec(PlusMinus(2), collate_fn=lambda batch: batch), "forkserver")


def test_tensors_count_as_next_to_nothing():
    size = pickled_bytes(_spec(Holding(torch.zeros(10 * MB, dtype=torch.uint8))), "spawn")
    assert 0 < size < 10_000


def test_numpy_arrays_count_in_full():
    size = pickled_bytes(_spec(Holding(np.zeros(10 * MB, dtype=np.uint8))), "spawn")
    assert 10 * MB < size < 11 * MB


def test_pickled_size_grows_with_the_dataset():
    small = pickled_bytes(_spec(Holding(list(range(10)))), "spawn")
    large = pickled_bytes(_spec(Holding(list(range(100_000)))), "spawn")
    assert large > small + 100_000
