"""Loader names under `loaderdoctor run`, from the real hooks on torch's DataLoader: where the user's code made the
loader, whichever code called the constructor. A framework (here a stand-in installed under site-packages) that
makes a loader for the user is named by its method and the user's line; one that re-makes a loader it was given
keeps the given one's name; a wrapper of the constructor or a subclass's __init__ does not hide the user's line;
two loaders never share a name."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.utils.data import DataLoader

from loaderdoctor.job.loaders import EveryLoader
from loaderdoctor.job.sites import creation_site

HERE = Path(__file__).name  # loaders made in this file are named by its name and a line

FRAMEWORK = """\
from torch.utils.data.dataloader import DataLoader


class Trainer:
    def __init__(self, dataset):
        self.dataset = dataset

    def train(self):
        return list(self.get_train_dataloader())

    def get_train_dataloader(self):
        return self._get_dataloader(self.dataset)

    def _get_dataloader(self, dataset):
        return DataLoader(dataset, batch_size=2)


class Loader:
    def __init__(self, dataset):
        self.inner = DataLoader(dataset, batch_size=4)

    def __iter__(self):
        return iter(self.inner)


def prepare(loader):
    return _Shard(loader)


class _Shard:
    def __init__(self, loader):
        self.base = DataLoader(loader.dataset, batch_sampler=loader.batch_sampler)

    def __iter__(self):
        return iter(self.base)


def with_wrapped_init(make):
    original = DataLoader.__init__

    def wrapper(obj, *args, **kwargs):
        original(obj, *args, **kwargs)

    DataLoader.__init__ = wrapper
    try:
        return make()
    finally:
        DataLoader.__init__ = original
"""


@pytest.fixture
def framework(tmp_path: Path) -> ModuleType:
    """The stand-in framework, imported from a site-packages folder: its code is a package's, not the user's."""
    path = tmp_path / "site-packages" / "framework_t35.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(FRAMEWORK))
    spec = importlib.util.spec_from_file_location("framework_t35", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _line() -> int:
    return sys._getframe(1).f_lineno


def _names(every: EveryLoader) -> list[str]:
    return [run.report.name for run in every.close()]


def test_a_loader_a_framework_makes_is_named_by_its_method_and_the_users_line(framework):
    every = EveryLoader()
    every.install()
    try:
        line, batches = _line(), framework.Trainer(torch.arange(8)).train()
        assert len(batches) == 4
        wrapper_line, wrapper = _line(), framework.Loader(torch.arange(8))
        assert len(list(wrapper)) == 2
    finally:
        names = _names(every)
    assert names == [f"Trainer.get_train_dataloader ({HERE}:{line})", f"Loader ({HERE}:{wrapper_line})"]


def test_a_loader_a_framework_makes_again_keeps_the_users_name_and_is_watched_once(framework):
    every = EveryLoader()
    every.install()
    try:
        line, loader = _line(), DataLoader(torch.arange(8), batch_size=4)
        prepared = framework.prepare(loader)
        assert [len(batch) for batch in prepared] == [4, 4]
    finally:
        names = _names(every)
    assert names == [f"{HERE}:{line}"]


def test_a_wrapper_of_the_constructor_or_a_subclass_does_not_hide_the_users_line(framework):
    class Mine(DataLoader):
        def __init__(self, dataset: torch.Tensor) -> None:
            super().__init__(dataset, batch_size=4)

    every = EveryLoader()
    every.install()
    try:
        wrapped_line, wrapped = _line(), framework.with_wrapped_init(lambda: DataLoader(torch.arange(8), batch_size=4))
        mine_line, mine = _line(), Mine(torch.arange(8))
        assert sum(len(b) for b in wrapped) == sum(len(b) for b in mine) == 8
    finally:
        names = _names(every)
    assert names == [f"{HERE}:{wrapped_line}", f"{HERE}:{mine_line}"]


def test_loaders_made_at_one_place_never_share_a_name(framework):
    every = EveryLoader()
    every.install()
    try:
        line, loaders = _line(), [DataLoader(torch.arange(n), batch_size=2) for n in (4, 6, 8)]
        again = framework.Trainer(torch.arange(4))
        assert [len(list(loader)) for loader in loaders] == [2, 3, 4]
        again.train(), again.train()
    finally:
        names = _names(every)
    site, trainer = f"{HERE}:{line}", f"Trainer.get_train_dataloader ({HERE}:{line + 3})"
    assert names == [site, f"{site}#2", f"{site}#3", trainer, f"{trainer}#2"]
    assert len(set(names)) == len(names)


def test_without_a_frame_there_is_no_name_and_the_users_frame_is_its_line():
    assert creation_site(None) is None
    frame = sys._getframe()  # a frame of this test: the user's own code
    assert creation_site(frame) == f"{HERE}:{frame.f_lineno}"
