"""state_dict()/load_state_dict() with 2 persistent workers: a run saved mid-epoch and resumed in a new guarded
loader delivers the plain DataLoader's batches of an uninterrupted run, every index once per epoch."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader

from loaderdoctor.guard import guard
from shared_datasets import Indices

pytestmark = [pytest.mark.workers, pytest.mark.timeout(60)]

SEED = 5
N = 40  # 10 batches of 4


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(SEED)
    return DataLoader(
        Indices(N), batch_size=4, shuffle=True, generator=generator, num_workers=2, persistent_workers=True
    )


def _indices(batches) -> list[list[int]]:
    return [b.tolist() for b in batches]


def test_a_run_of_persistent_workers_resumed_mid_epoch_delivers_an_uninterrupted_runs_batches():
    plain = _loader()
    expected = [_indices(plain) for _ in range(4)]
    plain._iterator._shutdown_workers()  # the plain loader's persistent workers, ended now
    with guard(_loader()) as first:
        got = [_indices(first) for _ in range(2)]
        iterator = iter(first)
        got.append(_indices(next(iterator) for _ in range(5)))
        state = json.loads(json.dumps(first.state_dict()))
    with guard(_loader()) as resumed:
        resumed.load_state_dict(state)
        got[2] += _indices(resumed)
        got.append(_indices(resumed))
        assert resumed.events == [] and resumed.restarts == 0
    assert got == expected
    assert all(sorted(i for batch in epoch for i in batch) == list(range(N)) for epoch in got)
