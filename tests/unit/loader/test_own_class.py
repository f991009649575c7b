"""A loader of the user's own class rebuilt as that class (loader/ownclass.py, through LoaderSpec): its own
arguments read back from the loader, torch's that it does not take left out at their defaults; a class that
cannot be rebuilt so is rebuilt as torch's DataLoader, said once, with the reason."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.loader.settings import LoaderSpec, Settings

pytestmark = pytest.mark.workers


class Tagged(DataLoader):
    """An argument of its own, kept under its name; the rest passed to torch's."""

    def __init__(self, dataset, tag, **kwargs):
        super().__init__(dataset, **kwargs)
        self.tag = tag


class Narrow(DataLoader):
    """Takes only some of torch's arguments: no sampler, no generator."""

    def __init__(self, dataset, batch_size=1, num_workers=0, collate_fn=None, worker_init_fn=None,
                 persistent_workers=False, prefetch_factor=None, timeout=0, pin_memory=False, drop_last=False,
                 multiprocessing_context=None):  # fmt: skip
        super().__init__(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_fn,
                         worker_init_fn=worker_init_fn, persistent_workers=persistent_workers,
                         prefetch_factor=prefetch_factor, timeout=timeout, pin_memory=pin_memory,
                         drop_last=drop_last, multiprocessing_context=multiprocessing_context)  # fmt: skip


class Hidden(DataLoader):
    """An argument it keeps under another name: it cannot be read back."""

    def __init__(self, dataset, scale, **kwargs):
        super().__init__(dataset, **kwargs)
        self.factor = scale


def test_a_loader_of_its_own_class_is_rebuilt_as_it_with_its_own_arguments_and_new_settings():
    spec = LoaderSpec.from_loader(Tagged(torch.arange(12), "mine", batch_size=4))
    rebuilt = spec.build(Settings(num_workers=2, persistent_workers=True))
    assert type(rebuilt) is Tagged and rebuilt.tag == "mine"
    assert (rebuilt.num_workers, rebuilt.persistent_workers, rebuilt.batch_sampler.batch_size) == (2, True, 4)
    assert [len(batch) for batch in spec.build(Settings())] == [4, 4, 4]


def test_a_class_that_does_not_take_torchs_arguments_is_not_rebuilt_as_itself_saying_which():
    spec = LoaderSpec.from_loader(Narrow(torch.arange(6), batch_size=3))
    assert spec.not_own_class is not None and "does not take torch's DataLoader arguments" in spec.not_own_class
    assert "batch_sampler, generator, in_order" in spec.not_own_class
    with pytest.warns(LoaderDoctorWarning, match="rebuilt as torch's DataLoader"):
        assert type(spec.build(Settings())) is DataLoader


def test_a_class_that_cannot_be_rebuilt_as_itself_is_rebuilt_as_torchs_said_once_with_why():
    spec = LoaderSpec.from_loader(Hidden(torch.arange(8), 2.0, batch_size=2))
    with pytest.warns(LoaderDoctorWarning, match="takes 'scale', which the loader keeps under no name"):
        first = spec.build(Settings())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = spec.build(Settings(num_workers=1))
    assert type(first) is DataLoader and type(second) is DataLoader and second.batch_sampler.batch_size == 2


def test_torchdatas_stateful_dataloader_is_rebuilt_as_itself_keeping_its_snapshot_interval():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(torch.arange(16), batch_size=4, snapshot_every_n_steps=3)
    rebuilt = LoaderSpec.from_loader(loader).build(Settings(num_workers=1))
    assert type(rebuilt) is stateful.StatefulDataLoader and rebuilt.snapshot_every_n_steps == 3
    assert sum(len(batch) for batch in rebuilt) == 16 and "_snapshot" in rebuilt.state_dict()


def test_the_snippet_names_the_loaders_own_class():
    settings = Settings(num_workers=2, persistent_workers=True)
    assert settings.snippet() == "loader = DataLoader(dataset, batch_size=..., num_workers=2, persistent_workers=True)"
    stateful = settings.snippet("torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader")
    assert stateful == "loader = StatefulDataLoader(dataset, batch_size=..., num_workers=2, persistent_workers=True)"
