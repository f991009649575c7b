"""state_dict()/load_state_dict() without workers: a loader built anew from a saved state delivers the batches
not yet delivered, then the later epochs, exactly as one uninterrupted run; a state that does not fit the
loader is refused, saying what differs."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from loaderdoctor.errors import UsageError
from loaderdoctor.guard import guard
from loaderdoctor.guard.loader import STATE_VERSION
from shared_datasets import Indices

SEED = 7
N = 30  # 8 batches of 4, the last of 2


class BadAt(Indices):
    def __getitem__(self, index: int) -> int:
        if index in (3, 11):
            raise ValueError(f"unreadable sample {index}")
        return index


def _loader(dataset: Dataset | None = None, seed: int = SEED, **kwargs) -> DataLoader:
    options = {"batch_size": 4, "shuffle": True, "generator": torch.Generator().manual_seed(seed), **kwargs}
    return DataLoader(dataset or Indices(N), **options)


def _indices(batches) -> list:
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in batches]


def _saved(state: dict) -> dict:
    """The state as it comes back from a JSON file."""
    return json.loads(json.dumps(state))


def _uninterrupted(epochs: int, **kwargs) -> list:
    plain = _loader(**kwargs)
    return [_indices(plain) for _ in range(epochs)]


@pytest.mark.parametrize("kwargs", [{}, {"batch_size": None}, {"drop_last": True}])
def test_a_run_resumed_mid_epoch_delivers_what_an_uninterrupted_run_does(kwargs):
    expected = _uninterrupted(4, **kwargs)
    with guard(_loader(**kwargs)) as first:
        got = [_indices(first) for _ in range(2)]
        iterator = iter(first)
        half = len(first) // 2
        got.append(_indices(next(iterator) for _ in range(half)))
        state = _saved(first.state_dict())
    assert state["epoch"] == 2 and state["position"] == half and state["epoch_started"]
    with guard(_loader(seed=SEED + 1, **kwargs)) as resumed:  # another seed: the state's generator wins
        resumed.load_state_dict(state)
        got[2] += _indices(resumed)
        got += [_indices(resumed)]
    assert got == expected


def test_a_state_taken_between_epochs_resumes_at_the_next_epochs_start():
    expected = _uninterrupted(3)
    with guard(_loader()) as first:
        got = [_indices(first) for _ in range(2)]
        state = _saved(first.state_dict())
    assert state["epoch"] == 2 and state["position"] == 0 and not state["epoch_started"]
    with guard(_loader()) as resumed:
        resumed.load_state_dict(state)
        got.append(_indices(resumed))
    assert got == expected


def test_a_state_after_the_last_batch_but_before_stop_iteration_is_between_epochs():
    with guard(_loader()) as first:
        iterator = iter(first)
        for _ in range(len(first)):
            next(iterator)
        state = first.state_dict()
    assert state["epoch"] == 1 and not state["epoch_started"]


def test_a_fresh_loaders_state_starts_at_epoch_0_and_a_loaded_state_is_given_back_unchanged():
    with guard(_loader()) as fresh:
        assert fresh.state_dict()["epoch"] == 0 and not fresh.state_dict()["epoch_started"]
        iterator = iter(fresh)
        next(iterator)
        state = _saved(fresh.state_dict())
    with guard(_loader()) as resumed:
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state


def test_a_sampler_with_its_own_generator_is_restored_too():
    def build() -> DataLoader:
        sampler = RandomSampler(Indices(N), generator=torch.Generator().manual_seed(SEED))
        return DataLoader(Indices(N), batch_size=4, sampler=sampler, generator=torch.Generator().manual_seed(1))

    plain = build()
    expected = [_indices(plain) for _ in range(3)]
    with guard(build()) as first:
        got = [_indices(first)]
        iterator = iter(first)
        got.append(_indices([next(iterator), next(iterator)]))
        state = _saved(first.state_dict())
    assert sorted(state["generators"]) == ["generator", "sampler.generator"]
    assert len(state["generators"]["generator"]) == torch.Generator().get_state().numel()
    with guard(build()) as resumed:
        resumed.load_state_dict(state)
        got[1] += _indices(resumed)
        got.append(_indices(resumed))
    assert got == expected


def test_the_bad_sample_budget_and_restart_count_carry_over():
    with guard(_loader(BadAt(N)), on_sample_error="skip", max_bad_fraction=0.5) as first:
        _indices(first)
        first.restarts = 2  # as if two restarts had happened
        state = _saved(first.state_dict())
        skipped = list(first.skipped)
    assert sorted(skipped) == [3, 11] and state["samples_seen"] == N and state["restarts"] == 2
    with guard(_loader(BadAt(N)), on_sample_error="skip", max_bad_fraction=0.5) as resumed:
        resumed.load_state_dict(state)
        assert resumed.skipped == skipped and resumed.restarts == 2
        _indices(resumed)
        assert sorted(resumed.skipped) == [3, 3, 11, 11] and resumed.state_dict()["samples_seen"] == 2 * N


def test_loading_ends_the_epoch_under_way_and_the_next_iter_resumes_the_saved_one():
    expected = _uninterrupted(1)[0]
    with guard(_loader()) as first:
        iterator = iter(first)
        head = [next(iterator) for _ in range(3)]
        state = first.state_dict()
        next(iterator)
        first.load_state_dict(state)
        with pytest.raises(StopIteration):
            next(iterator)
        assert _indices(head) + _indices(first) == expected


def _state() -> dict:
    with guard(_loader()) as loader:
        iterator = iter(loader)
        next(iterator)
        return _saved(loader.state_dict())


@pytest.mark.parametrize(
    ("change", "loader", "words"),
    [
        ({"version": STATE_VERSION + 1}, {}, f"of version {STATE_VERSION + 1}; this loaderdoctor reads version 2"),
        ({}, {"dataset": Indices(31)}, "saved from a loader with dataset_length=30; this one has dataset_length=31"),
        ({}, {"batch_size": 5}, "batch_size=4; this one has batch_size=5"),
        ({}, {"generator": None}, r"holds the generators \['generator'\].*this loader has none"),
        ({"position": 99}, {}, "position 99 is past the end of the epoch, which has 8 batches"),
        ({"epoch_started": "yes"}, {}, "epoch_started must be true or false"),
        ({"epoch_started": False}, {}, "epoch_started, position and global_generator disagree"),
        ({"global_generator": [1, 2]}, {}, "torch's global generator is not a list of 5056 bytes"),
        ({"seed_state": [0, 1]}, {}, "workers' seed generator is not a list of 5056 bytes"),
        ({"position": -1}, {}, "must be whole numbers"),
        ({"skipped": ["x"]}, {}, "skipped must be a list of indices"),
    ],
)
def test_a_state_that_does_not_fit_is_refused_saying_what_differs(change, loader, words):
    state = {**_state(), **change}
    with guard(_loader(**loader)) as resumed:
        with pytest.raises(UsageError, match=words):
            resumed.load_state_dict(state)
        assert resumed.state_dict()["epoch"] == 0  # nothing changed


def test_a_state_lacking_keys_or_not_a_dict_is_refused():
    state = _state()
    del state["epoch_started"]
    with guard(_loader()) as resumed:
        with pytest.raises(UsageError, match="the state lacks epoch_started"):
            resumed.load_state_dict(state)
        with pytest.raises(UsageError, match="expects the dict that state_dict\\(\\) returns, not list"):
            resumed.load_state_dict([])


def test_a_resume_draws_the_order_from_the_global_state_of_the_first_draw():
    # A RandomSampler without a generator draws its seed from torch's global generator at the first next(), not at
    # iter(): user code in between (a model's init) moves the global generator, and the saved state must follow.
    torch.manual_seed(3)
    with guard(DataLoader(Indices(N), batch_size=4, shuffle=True)) as first:
        batches = iter(first)
        torch.rand(5)  # between iter() and the first batch
        delivered = [next(batches).tolist(), next(batches).tolist()]
        rest = [b.tolist() for b in batches]
    torch.manual_seed(3)
    with guard(DataLoader(Indices(N), batch_size=4, shuffle=True)) as again:
        batches = iter(again)
        torch.rand(5)
        assert [next(batches).tolist(), next(batches).tolist()] == delivered
        saved = _saved(again.state_dict())
    with guard(DataLoader(Indices(N), batch_size=4, shuffle=True)) as resumed:
        resumed.load_state_dict(saved)
        assert [b.tolist() for b in resumed] == rest
