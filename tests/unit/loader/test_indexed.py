"""The indexed dataset wrappers: items pass through, a failing item's error names its index, also after the
trip from a worker process."""

from __future__ import annotations

import pickle

import pytest
from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader

from loaderdoctor.loader.indexed import IndexedDataset, SampleFailure, parse_sample_failures, sample_failure


class Squares:
    """A map-style dataset of i*i whose listed indices raise ValueError."""

    def __init__(self, n: int = 10, bad: tuple[int, ...] = ()) -> None:
        self.n = n
        self.bad = bad
        self.root = "/data/squares"
        self.item_calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        self.item_calls += 1
        if index in self.bad:
            raise ValueError(f"bad sample {index}\nsecond line of detail")
        return index * index


class BatchSquares(Squares):
    """Squares that loads a whole batch at once, failing the batch when any of its samples is bad."""

    def __init__(self, n: int = 10, bad: tuple[int, ...] = ()) -> None:
        super().__init__(n, bad)
        self.batch_calls = 0

    def __getitems__(self, indices: list[int]) -> list[int]:
        self.batch_calls += 1
        if any(i in self.bad for i in indices):
            raise RuntimeError("batch decode failed")
        return [i * i for i in indices]


def test_items_pass_through():
    wrapped = IndexedDataset(Squares(5))
    assert len(wrapped) == 5
    assert [wrapped[i] for i in range(5)] == [0, 1, 4, 9, 16]


def test_a_failing_item_names_its_index():
    wrapped = IndexedDataset(Squares(20, bad=(12,)))
    with pytest.raises(SampleFailure) as raised:
        wrapped[12]
    assert isinstance(raised.value.__cause__, ValueError)
    assert str(raised.value) == "dataset[12] raised ValueError: bad sample 12"
    assert parse_sample_failures(raised.value) == [(12, "ValueError", "bad sample 12")]


def test_sample_failure_message_has_a_line_per_sample():
    failure = sample_failure([(3, KeyError("x")), (-1, OSError("disk\ngone"))])
    assert str(failure) == "dataset[3] raised KeyError: 'x'\ndataset[-1] raised OSError: disk"
    assert parse_sample_failures(failure) == [(3, "KeyError", "'x'"), (-1, "OSError", "disk")]


def test_parse_a_failure_wrapped_the_way_torch_wraps_worker_errors():
    text = (
        "Caught SampleFailure in DataLoader worker process 0.\n"
        "Original Traceback (most recent call last):\n"
        '  File "/site-packages/torch/utils/data/_utils/worker.py", line 308, in _worker_loop\n'
        "    data = fetcher.fetch(index)\n"
        '  File "/site-packages/loaderdoctor/indexed.py", line 44, in __getitem__\n'
        "    raise sample_failure([(index, error)]) from error\n"
        "loaderdoctor.loader.indexed.SampleFailure: dataset[12] raised ValueError: bad\n"
    )
    assert parse_sample_failures(SampleFailure(text)) == [(12, "ValueError", "bad")]


def test_parse_a_failure_reraised_by_torchs_exception_wrapper():
    # What reaches the main process from a worker: the exception re-created from its type and full text,
    # the chained original traceback included.
    wrapped = IndexedDataset(Squares(20, bad=(7, 9)))
    try:
        wrapped.__getitems__([6, 7, 8, 9])
    except SampleFailure:
        carried = ExceptionWrapper(where="in DataLoader worker process 1")
    with pytest.raises(SampleFailure) as raised:
        carried.reraise()
    assert str(raised.value).startswith("Caught SampleFailure in DataLoader worker process 1.")
    assert "ValueError: bad sample 7\nsecond line of detail" in str(raised.value)  # the original traceback is in there
    assert parse_sample_failures(raised.value) == [(7, "ValueError", "bad sample 7"), (9, "ValueError", "bad sample 9")]


def test_parse_an_error_that_names_no_sample():
    assert parse_sample_failures(ValueError("bad")) == [(None, "ValueError", "bad")]
    assert parse_sample_failures(RuntimeError("\n  first words\nmore\n")) == [(None, "RuntimeError", "first words")]
    assert parse_sample_failures(RuntimeError()) == [(None, "RuntimeError", "")]


def test_attributes_are_delegated():
    wrapped = IndexedDataset(Squares(3))
    assert wrapped.root == "/data/squares"
    assert wrapped.bad == ()
    with pytest.raises(AttributeError):
        _ = wrapped.no_such_attribute


def test_an_uninitialised_wrapper_does_not_recurse():
    bare = IndexedDataset.__new__(IndexedDataset)
    with pytest.raises(AttributeError):
        _ = bare.root


def test_pickling_round_trip():
    wrapped = IndexedDataset(Squares(6, bad=(2,)))
    copy = pickle.loads(pickle.dumps(wrapped))
    assert type(copy) is IndexedDataset
    assert [copy[i] for i in (0, 1, 3)] == [0, 1, 9]
    assert copy.root == "/data/squares"
    with pytest.raises(SampleFailure, match=r"dataset\[2\] raised ValueError"):
        copy[2]


def test_getitems_uses_the_datasets_own_when_it_has_one():
    inner = BatchSquares(8)
    loader = DataLoader(IndexedDataset(inner), batch_size=4, collate_fn=list)
    assert list(loader) == [[0, 1, 4, 9], [16, 25, 36, 49]]
    assert (inner.batch_calls, inner.item_calls) == (2, 0)


def test_getitems_loads_one_by_one_when_the_dataset_has_none():
    inner = Squares(8)
    assert not hasattr(inner, "__getitems__")
    loader = DataLoader(IndexedDataset(inner), batch_size=4, collate_fn=list)
    assert list(loader) == [[0, 1, 4, 9], [16, 25, 36, 49]]
    assert inner.item_calls == 8


def test_getitems_names_every_failing_index_when_the_batch_call_fails():
    inner = BatchSquares(8, bad=(4, 6))
    with pytest.raises(SampleFailure) as raised:
        IndexedDataset(inner).__getitems__([4, 5, 6, 7])
    assert inner.batch_calls == 1
    assert inner.item_calls == 4  # every sample tried one by one to find the bad ones
    assert parse_sample_failures(raised.value) == [(4, "ValueError", "bad sample 4"), (6, "ValueError", "bad sample 6")]
    assert isinstance(raised.value.__cause__, ValueError)


def test_getitems_names_the_failing_index_through_a_loader():
    loader = DataLoader(IndexedDataset(Squares(8, bad=(5,))), batch_size=4, collate_fn=list)
    batches = iter(loader)
    assert next(batches) == [0, 1, 4, 9]
    with pytest.raises(SampleFailure) as raised:
        next(batches)
    assert parse_sample_failures(raised.value) == [(5, "ValueError", "bad sample 5")]
