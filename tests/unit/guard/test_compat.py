"""guard/compat.py: the torch internals the guard uses are there on the installed torch; where one is missing,
loaderdoctor.DataLoader, guard() and patch() give plain loaders that iterate, with one warning per process."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils.data
from torch.utils.data import dataloader as torch_dataloader
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data.dataloader import DataLoader as TorchDataLoader

import loaderdoctor
from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.guard import GuardedLoader, compat

_DATA = list(range(10))


@pytest.fixture(autouse=True)
def fresh_check(monkeypatch):
    """Each test checks torch anew and may warn again; the next test (and the rest of the run) too."""
    compat._missing.cache_clear()
    monkeypatch.setattr(compat, "_warned", False)
    yield
    compat._missing.cache_clear()


@pytest.fixture(
    params=[
        (torch_worker, "_generate_state"),
        (torch_dataloader._MultiProcessingDataLoaderIter, "_shutdown_workers"),
        (torch_worker, "_worker_info"),
    ],
    ids=["_generate_state", "_shutdown_workers", "_worker_info"],
)
def torch_without_one(request, monkeypatch):
    """A torch that lacks one of the internals the guard uses (the test iterates without workers only)."""
    owner, name = request.param
    monkeypatch.delattr(owner, name)
    return name


def test_the_installed_torch_has_every_internal_the_guard_uses():
    assert compat.internals_missing() == []
    assert compat.supported() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not compat.unguardable()
        loader = loaderdoctor.DataLoader(_DATA, batch_size=4)
    try:
        assert isinstance(loader, GuardedLoader)
    finally:
        loader.close()


def test_a_missing_internal_is_named_with_the_torch_version(torch_without_one):
    missing = compat.internals_missing()
    assert len(missing) == 1
    assert torch_without_one in missing[0]
    reason = compat.supported()
    assert reason is not None
    assert torch.__version__ in reason and torch_without_one in reason


def test_dataloader_falls_back_to_torchs_with_one_warning(torch_without_one):
    with pytest.warns(LoaderDoctorWarning) as caught:
        first = loaderdoctor.DataLoader(_DATA, batch_size=4)
        second = loaderdoctor.DataLoader(_DATA, batch_size=3, shuffle=True)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert torch_without_one in message and torch.__version__ in message and "unguarded" in message
    assert caught[0].filename == __file__  # points at the user's line, not inside loaderdoctor
    assert type(first) is TorchDataLoader and type(second) is TorchDataLoader
    assert [b.tolist() for b in first] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert sorted(x for b in second for x in b.tolist()) == _DATA


def test_guard_returns_the_loader_unchanged(torch_without_one):
    loader = TorchDataLoader(_DATA, batch_size=5)
    with pytest.warns(LoaderDoctorWarning) as caught:
        assert loaderdoctor.guard(loader) is loader
        assert loaderdoctor.guard(loader, max_restarts=1) is loader
    assert len(caught) == 1
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_patch_gives_plain_loaders(torch_without_one):
    with pytest.warns(LoaderDoctorWarning) as caught, loaderdoctor.patched():
        first = torch.utils.data.DataLoader(_DATA, batch_size=4)
        second = torch.utils.data.DataLoader(_DATA, batch_size=2)
    assert not loaderdoctor.is_patched()
    assert len(caught) == 1
    assert caught[0].filename == __file__
    assert type(first) is TorchDataLoader and type(second) is TorchDataLoader
    assert [b.tolist() for b in second] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_the_check_runs_once_per_process(torch_without_one, monkeypatch):
    assert compat.internals_missing()
    monkeypatch.undo()  # torch whole again: the answer is the one found first
    assert compat.internals_missing()
