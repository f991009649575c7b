"""The guard over an IterableDataset with state_dict()/load_state_dict(), loading in the main process: the plain
loader's batches, state_dict()/load_state_dict() resuming exactly, a main-process stall resumed where its stream
was, and clear errors for what it cannot do. tests/integration/test_guard_stream_faults.py has the workers."""

from __future__ import annotations

import json
import pickle
import threading

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from loaderdoctor.errors import UsageError
from loaderdoctor.guard import guard
from loaderdoctor.guard.loader import STATE_VERSION
from loaderdoctor.guard.streams import GuardedStream, StreamBatch, StreamRecord
from shared_datasets import Indices

N = 30  # 8 batches of 4, the last of 2


class Counter(IterableDataset):
    """Yields 0..N-1; its state is how far it got. Raises at `raise_at`; hangs the first time it reaches
    `hang_at` (and then holds a lock: it cannot be pickled for a worker)."""

    def __init__(self, *, raise_at: int | None = None, hang_at: int | None = None) -> None:
        self.raise_at = raise_at
        self.hang_at = hang_at
        self.hung = False
        if hang_at is not None:
            self.lock = threading.Lock()
        self.position = 0
        self.resuming = False

    def __iter__(self):
        if not self.resuming:
            self.position = 0
        self.resuming = False
        while self.position < N:
            item = self.position
            self.position += 1
            if item == self.raise_at:
                raise ValueError(f"item {item} is unreadable")
            if item == self.hang_at and not self.hung:
                self.hung = True
                threading.Event().wait()
            yield item

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self.resuming = True


class SizedCounter(Counter):
    def __len__(self) -> int:
        return N


def as_dict(samples: list[int]) -> dict:
    return {"items": torch.tensor(samples), "count": len(samples)}


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    return value


def _epoch(batches) -> list:
    return [_plain(batch) for batch in batches]


def _saved(state: dict) -> dict:
    """The state as it comes back from a JSON file."""
    return json.loads(json.dumps(state))


def _loader(dataset: IterableDataset | None = None, **kwargs) -> DataLoader:
    return DataLoader(dataset if dataset is not None else Counter(), **{"batch_size": 4, **kwargs})


VARIANTS = [{}, {"batch_size": None}, {"drop_last": True}, {"collate_fn": as_dict}]


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_without_faults_the_guarded_loader_yields_what_the_plain_one_does(kwargs):
    plain = _loader(**kwargs)
    expected = [_epoch(plain) for _ in range(2)]
    with guard(_loader(**kwargs)) as guarded:
        assert [_epoch(guarded) for _ in range(2)] == expected
        assert guarded.events == []


def test_len_is_the_plain_loaders():
    with guard(_loader(SizedCounter())) as guarded:
        assert len(guarded) == len(_loader(SizedCounter())) == 8
    with guard(_loader()) as guarded, pytest.raises(TypeError):
        len(guarded)


@pytest.mark.parametrize("kwargs", VARIANTS)
def test_a_run_resumed_mid_epoch_delivers_what_an_uninterrupted_run_does(kwargs):
    plain = _loader(**kwargs)
    expected = [_epoch(plain) for _ in range(3)]
    with guard(_loader(**kwargs)) as first:
        got = [_epoch(first)]
        iterator = iter(first)
        got.append(_epoch(next(iterator) for _ in range(3)))
        state = _saved(first.state_dict())
    per_batch = 1 if kwargs.get("batch_size", 4) is None else 4
    assert state["dataset"] == "iterable" and state["num_workers"] == 0
    assert (state["epoch"], state["position"], state["last_worker"]) == (1, 3, 0)
    assert state["worker_states"] == {"0": {"position": 3 * per_batch}}
    with guard(_loader(**kwargs)) as resumed:
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state  # given back unchanged before iterating
        got[1] += _epoch(resumed)
        got.append(_epoch(resumed))
    assert got == expected


def test_a_state_taken_between_epochs_resumes_at_the_next_epochs_start():
    with guard(_loader()) as fresh:
        assert fresh.state_dict()["epoch"] == 0 and fresh.state_dict()["worker_states"] is None
        _epoch(fresh)
        _epoch(fresh)
        state = _saved(fresh.state_dict())
    assert (state["epoch"], state["position"], state["worker_states"], state["last_worker"]) == (2, 0, None, None)
    with guard(_loader()) as resumed:
        resumed.load_state_dict(state)
        assert _epoch(resumed) == _epoch(_loader())


def test_a_state_after_the_last_batch_but_before_stop_iteration_resumes_an_empty_rest_of_the_epoch():
    # The end of a stream is known only at StopIteration: the rest of the epoch is then empty, as it was.
    with guard(_loader()) as first:
        iterator = iter(first)
        for _ in range(8):
            next(iterator)
        state = _saved(first.state_dict())
    assert (state["epoch"], state["position"], state["worker_states"]) == (0, 8, {"0": {"position": N}})
    with guard(_loader()) as resumed:
        resumed.load_state_dict(state)
        assert _epoch(resumed) == []
        assert _epoch(resumed) == _epoch(_loader())
        assert resumed.state_dict()["epoch"] == 2


def test_loading_ends_the_epoch_under_way_and_the_next_iter_resumes_the_saved_one():
    expected = _epoch(_loader())
    with guard(_loader()) as first:
        iterator = iter(first)
        head = [next(iterator) for _ in range(3)]
        state = first.state_dict()
        next(iterator)
        first.load_state_dict(state)
        with pytest.raises(StopIteration):
            next(iterator)
        assert _epoch(head) + _epoch(first) == expected


def test_a_dataset_error_reaches_the_user_as_with_the_plain_loader():
    def outcomes(loader) -> list:
        seen, iterator = [], iter(loader)
        while True:
            try:
                seen.append(next(iterator).tolist())
            except StopIteration:
                return seen
            except ValueError as error:
                seen.append(str(error))

    with guard(_loader(Counter(raise_at=5))) as guarded:
        got = outcomes(guarded)
        assert guarded.state_dict()["epoch"] == 1
    # The generator ends with its error: the plain loader's epoch ends there too.
    assert got == outcomes(_loader(Counter(raise_at=5))) == [[0, 1, 2, 3], "item 5 is unreadable"]


@pytest.mark.timeout(30)
def test_an_interrupted_main_process_stall_resumes_the_stream_after_its_last_batch_delivered():
    with guard(_loader(Counter(hang_at=13)), stall_timeout=1) as guarded:
        got = [_epoch(guarded) for _ in range(2)]
        assert [e.kind for e in guarded.events] == ["stall", "restart"]
        restart = guarded.events[1]
    assert got == [_epoch(_loader())] * 2
    # The dataset holds a lock: it cannot go to a spawned worker, so the main process loads it again.
    assert restart.batch == 3 and restart.detail["streams"] == {"resumed": [0], "first": 0}
    assert "again with no workers (main process)" in restart.message and not restart.detail["escalated"]


def test_on_sample_error_skip_is_refused_for_it():
    with pytest.raises(UsageError, match="an IterableDataset has no indices") as raised:
        guard(_loader(), on_sample_error="skip")
    assert "on_sample_error='raise'" in raised.value.hint


def _state(**kwargs) -> dict:
    with guard(_loader(**kwargs)) as loader:
        iterator = iter(loader)
        next(iterator)
        return _saved(loader.state_dict())


def _map_state() -> dict:
    with guard(DataLoader(Indices(N), batch_size=4)) as loader:
        iterator = iter(loader)
        next(iterator)
        return _saved(loader.state_dict())


@pytest.mark.parametrize(
    ("change", "loader", "words"),
    [
        ({"version": STATE_VERSION + 1}, {}, f"of version {STATE_VERSION + 1}; this loaderdoctor reads version 2"),
        ({}, {"batch_size": 5}, "batch_size=4; this one has batch_size=5"),
        ({}, {"generator": torch.Generator()}, r"holds the generators none .*this loader has \['generator'\]"),
        (
            {},
            {"num_workers": 2},
            r"holds 1 stream, saved with num_workers=0; this loader has num_workers=2: an IterableDataset",
        ),
        ({"worker_states": {"1": {"position": 4}}}, {}, "worker_states must be a dict from worker ids below 1"),
        ({"worker_states": [{"position": 4}]}, {}, "worker_states must be a dict"),
        ({"last_worker": 2}, {}, "last_worker must be None or a worker id below 1, not 2"),
        ({"position": -1}, {}, "must be whole numbers"),
        ({"dataset": None}, {}, "saved from a guarded loader over a map-style dataset; this loader's dataset is an"),
    ],
)
def test_a_state_that_does_not_fit_is_refused_saying_what_differs(change, loader, words):
    state = {**_state(), **change}
    with guard(_loader(**loader)) as resumed:  # never iterated: no worker starts
        with pytest.raises(UsageError, match=words):
            resumed.load_state_dict(state)
        assert resumed.state_dict()["epoch"] == 0  # nothing changed


def test_a_state_lacking_keys_is_refused():
    state = _state()
    del state["worker_states"]
    with guard(_loader()) as resumed, pytest.raises(UsageError, match="the state lacks worker_states"):
        resumed.load_state_dict(state)


def test_one_worker_and_none_are_the_same_one_stream():
    state = _state()
    with guard(_loader(num_workers=1)) as resumed:  # never iterated: no worker starts
        resumed.load_state_dict(state)
        assert resumed.state_dict() == {**state, "num_workers": 1}


def test_map_style_and_iterable_states_do_not_mix():
    with guard(_loader()) as stream, pytest.raises(UsageError, match="over a map-style dataset"):
        stream.load_state_dict(_map_state())
    with guard(DataLoader(Indices(N), batch_size=4)) as mapped, pytest.raises(UsageError, match="over an IterableD"):
        mapped.load_state_dict(_state())


def test_the_wrapper_passes_attributes_through_and_the_tag_travels_whole():
    dataset = Counter()
    wrapper = GuardedStream(dataset)
    wrapper.handle = "opened in a worker"
    assert dataset.handle == "opened in a worker" and wrapper.raise_at is None and wrapper.rotation == 0
    assert pickle.loads(pickle.dumps(wrapper)).inner.position == 0
    tagged = pickle.loads(pickle.dumps(StreamBatch(torch.tensor([1, 2]), 1, {"position": 2})))
    assert tagged.batch.tolist() == [1, 2] and (tagged.stream, tagged.state) == (1, {"position": 2})


def test_the_next_iterator_deals_from_the_stream_after_the_one_delivered_last():
    record = StreamRecord()
    assert record.rotation(3) == 0
    assert record.delivered(StreamBatch("batch", 2, {"position": 8})) == "batch"
    assert record.rotation(3) == 0 and record.states == {2: {"position": 8}}
    record.delivered(StreamBatch("next", 0, {"position": 12}))
    assert record.rotation(3) == 1 and record.rotation(0) == record.rotation(1) == 0
    with pytest.raises(RuntimeError, match="without its stream's tag"):
        record.delivered("untagged")
