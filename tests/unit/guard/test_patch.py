"""patch() / unpatch() / patched(): torch.utils.data.DataLoader made while patched is guarded, isinstance() still
holds, torch's class comes back exactly, and code that bound the class before patch() is left alone."""

from __future__ import annotations

import abc
import inspect
import logging
import pickle
import threading
import types

import pytest
import torch
import torch.utils.data
from torch.utils.data import Dataset, IterableDataset
from torch.utils.data.dataloader import DataLoader as TorchDataLoader

import loaderdoctor
from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.guard import GuardedLoader, batchplan
from loaderdoctor.guard import loader as guard_loader
from loaderdoctor.guard.patch import PatchedDataLoader, is_patched, patch, patched, unpatch
from loaderdoctor.loader import settings
from loaderdoctor.tap import iterator as tap
from shared_datasets import Pairs, Stream


class _ResumableStream(IterableDataset):
    """Yields 0, 1, 2; its state is how many it yielded."""

    def __init__(self) -> None:
        self.yielded = 0
        self.resuming = False

    def __iter__(self):
        self.yielded, self.resuming = (self.yielded if self.resuming else 0), False
        while self.yielded < 3:
            self.yielded += 1
            yield self.yielded - 1

    def state_dict(self) -> dict:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        self.yielded, self.resuming = state["yielded"], True


class MadeBefore(TorchDataLoader):
    """A user's subclass written before any patch."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset, batch_size=7)


@pytest.fixture(autouse=True)
def never_left_patched():
    assert torch.utils.data.DataLoader is TorchDataLoader, "an earlier test left torch patched"
    try:
        yield
    finally:
        unpatch()
    assert torch.utils.data.DataLoader is TorchDataLoader and not is_patched()


def _make():
    """A DataLoader as user code writes it: through the name torch.utils.data.DataLoader, looked up now."""
    return torch.utils.data.DataLoader(
        Pairs(21), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(4)
    )


def _indices(loader) -> list[list[int]]:
    return [batch[1].tolist() for batch in loader]


def test_a_dataloader_made_while_patched_is_guarded_and_yields_what_the_plain_one_does():
    plain = TorchDataLoader(Pairs(21), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(4))
    expected = [list(plain) for _ in range(2)]
    patch()
    assert is_patched()
    with _make() as guarded:
        assert type(guarded) is GuardedLoader and type(guarded.loader) is TorchDataLoader
        got = [list(guarded) for _ in range(2)]
        assert len(guarded) == len(plain) == 6
        assert guarded.batch_size == 4 and isinstance(guarded.dataset, Pairs)
    for got_epoch, expected_epoch in zip(got, expected, strict=True):
        for g, e in zip(got_epoch, expected_epoch, strict=True):
            assert torch.equal(g[0], e[0]) and torch.equal(g[1], e[1])


def test_unpatch_restores_torchs_class_exactly():
    patch()
    assert torch.utils.data.DataLoader is PatchedDataLoader
    unpatch()
    assert torch.utils.data.DataLoader is TorchDataLoader and not is_patched()
    assert type(torch.utils.data.DataLoader(Pairs(21))) is TorchDataLoader
    unpatch()  # nothing in force: nothing happens
    assert torch.utils.data.DataLoader is TorchDataLoader


def test_isinstance_holds_for_guarded_and_plain_loaders_while_patched():
    plain = TorchDataLoader(Pairs(21))
    patch()
    with _make() as guarded:
        assert isinstance(guarded, torch.utils.data.DataLoader)
        assert isinstance(plain, torch.utils.data.DataLoader)
        assert isinstance(MadeBefore(Pairs(21)), torch.utils.data.DataLoader)
        assert not isinstance([plain], torch.utils.data.DataLoader)
        assert not isinstance(None, torch.utils.data.DataLoader)
        assert issubclass(GuardedLoader, torch.utils.data.DataLoader)
        assert issubclass(MadeBefore, torch.utils.data.DataLoader) and issubclass(TorchDataLoader, PatchedDataLoader)
        assert not issubclass(list, torch.utils.data.DataLoader)
        # As documented: a class bound before patch() is torch's, and a GuardedLoader is no instance of it.
        assert not isinstance(guarded, TorchDataLoader)
        unpatch()
        assert not isinstance(guarded, torch.utils.data.DataLoader)


def test_the_patched_name_still_reads_like_torchs_class():
    patch()
    assert inspect.isclass(torch.utils.data.DataLoader)
    assert inspect.signature(torch.utils.data.DataLoader) == inspect.signature(TorchDataLoader)
    assert torch.utils.data.DataLoader[int] is not None  # annotations like DataLoader[Tensor] keep working
    assert type(torch.utils.data.DataLoader[int](Pairs(21))) is GuardedLoader
    assert pickle.loads(pickle.dumps(TorchDataLoader(Pairs(21)))).batch_size == 1  # pickle finds torch's class


def test_the_guard_builds_its_loaders_with_torchs_class_never_a_patched_one():
    for module in (guard_loader, batchplan, settings, tap):
        assert module.DataLoader is TorchDataLoader, module.__name__
    patch()
    with _make() as guarded:
        iterator = iter(guarded)
        next(iterator)
        assert type(guarded._inner.loader) is TorchDataLoader  # the internal loader it iterates
        assert len(list(iterator)) == 5


def test_options_reach_every_guarded_loader():
    patch(stall_timeout=3.0, max_restarts=1)
    with _make() as guarded:
        assert guarded.policy.floor_s == guarded.policy.first_batch_s == 3.0 and guarded.max_restarts == 1


def test_persistent_workers_from_the_call_win_over_the_option():
    def made(**kwargs) -> bool:
        with torch.utils.data.DataLoader(Pairs(21), num_workers=2, **kwargs) as guarded:  # never iterated: no worker
            return guarded.settings.persistent_workers

    patch()
    assert made() and not made(persistent_workers=False)
    patch(persistent_workers=False)
    assert not made() and made(persistent_workers=True)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"stall_timout": 5}, r"unknown guard option for patch\(\): stall_timout"),
        ({"stall_timeout": 0}, "stall_timeout must be a number of seconds above 0"),
        ({"max_restarts": -1}, "max_restarts must be a whole number"),
    ],
)
def test_bad_options_raise_at_patch_and_leave_torch_alone(options, words):
    with pytest.raises(UsageError, match=words):
        patch(**options)
    assert torch.utils.data.DataLoader is TorchDataLoader and not is_patched()
    with pytest.raises(UsageError, match=words), patched(**options):
        pass
    assert torch.utils.data.DataLoader is TorchDataLoader


def test_patch_again_replaces_the_options_and_is_logged_once(caplog):
    caplog.set_level(logging.INFO, logger="loaderdoctor")
    patch(max_restarts=1)
    patch(max_restarts=1)
    patch(max_restarts=2)
    assert torch.utils.data.DataLoader is PatchedDataLoader
    with _make() as guarded:
        assert guarded.max_restarts == 2
    messages = [r.getMessage() for r in caplog.records]
    assert sum("torch.utils.data.DataLoader patched" in m for m in messages) == 1
    assert sum("guarded with max_restarts=2" in m for m in messages) == 1
    unpatch()  # one unpatch undoes them all
    assert torch.utils.data.DataLoader is TorchDataLoader
    assert any("DataLoader restored" in r.getMessage() for r in caplog.records)


def _library(source: str) -> types.ModuleType:
    module = types.ModuleType("some_library")
    exec(source, module.__dict__)
    return module


_LIBRARY = """
from torch.utils.data import DataLoader

def make(dataset):
    return DataLoader(dataset, batch_size=5)

def accepts(loader):
    return isinstance(loader, DataLoader)
"""


def test_a_library_that_bound_the_class_before_patch_is_left_alone():
    library = _library(_LIBRARY)
    patch()
    loader = library.make(Pairs(21))
    assert type(loader) is TorchDataLoader and library.accepts(loader)
    with _make() as guarded:
        assert not library.accepts(guarded)  # the documented limit


def test_a_library_that_bound_the_class_while_patched_guards_only_while_patched():
    patch()
    library = _library(_LIBRARY)
    with library.make(Pairs(21)) as guarded:
        assert type(guarded) is GuardedLoader and library.accepts(guarded)
        assert library.accepts(TorchDataLoader(Pairs(21)))
    unpatch()
    assert type(library.make(Pairs(21))) is TorchDataLoader


def test_subclasses_of_dataloader_stay_unguarded():
    patch()
    assert type(MadeBefore(Pairs(21))) is MadeBefore

    class MadeWhilePatched(torch.utils.data.DataLoader, abc.ABC):
        def __init__(self, dataset: Dataset) -> None:
            super().__init__(dataset, batch_size=10)

    class Typed(torch.utils.data.DataLoader[int]):
        pass

    for cls in (MadeWhilePatched, Typed):
        # Derived from torch's class, not from the patched one: nothing of the patch stays after unpatch().
        assert TorchDataLoader in cls.__mro__ and PatchedDataLoader not in cls.__mro__
    assert inspect.signature(Typed) == inspect.signature(TorchDataLoader)
    unpatch()
    loader = MadeWhilePatched(Pairs(21))
    assert type(loader) is MadeWhilePatched and _indices(loader)[-1] == [20]
    assert isinstance(loader, torch.utils.data.DataLoader) and type(Typed(Pairs(21))) is Typed


@pytest.mark.filterwarnings("error")  # as pytest's filterwarnings = error runs the user's tests
def test_a_loader_the_guard_cannot_resume_is_left_plain_and_said_in_the_log(caplog):
    patch()
    loader = torch.utils.data.DataLoader(Stream(3))
    assert type(loader) is TorchDataLoader and [b.tolist() for b in loader] == [[0], [1], [2]]
    assert "not guarded: the guard cannot resume the IterableDataset" in caplog.text


def test_an_iterable_dataset_with_state_dict_is_guarded_unless_the_options_do_not_fit_it(caplog):
    patch()
    with torch.utils.data.DataLoader(_ResumableStream()) as guarded:
        assert type(guarded) is GuardedLoader and [b.tolist() for b in guarded] == [[0], [1], [2]]
    patch(on_sample_error="skip")
    loader = torch.utils.data.DataLoader(_ResumableStream())
    assert "not guarded: on_sample_error='skip' replaces a sample" in caplog.text
    assert type(loader) is TorchDataLoader and [b.tolist() for b in loader] == [[0], [1], [2]]


def test_patched_holds_for_its_block_and_gives_back_what_was_there():
    with patched(max_restarts=1):
        with _make() as guarded:
            assert guarded.max_restarts == 1
        with patched(max_restarts=2), _make() as inner:
            assert inner.max_restarts == 2
        with _make() as guarded:
            assert guarded.max_restarts == 1
    assert torch.utils.data.DataLoader is TorchDataLoader
    patch(max_restarts=3)
    with pytest.raises(RuntimeError, match="inside"), patched(max_restarts=0):
        raise RuntimeError("inside")
    assert is_patched()
    with _make() as guarded:
        assert guarded.max_restarts == 3


def test_unpatch_inside_a_block_restores_torch_for_good():
    with patched():
        unpatch()
        assert torch.utils.data.DataLoader is TorchDataLoader
    assert torch.utils.data.DataLoader is TorchDataLoader


def test_another_patch_of_torch_is_neither_stacked_on_nor_undone(monkeypatch):
    def someone_elses(*args, **kwargs):
        return TorchDataLoader(*args, **kwargs)

    monkeypatch.setattr(torch.utils.data, "DataLoader", someone_elses)
    with pytest.raises(UsageError, match=r"replaced by .*someone_elses"):
        patch()
    assert torch.utils.data.DataLoader is someone_elses
    monkeypatch.undo()
    patch()
    monkeypatch.setattr(torch.utils.data, "DataLoader", someone_elses)
    with pytest.warns(LoaderDoctorWarning, match="left as it is"):
        unpatch()
    assert torch.utils.data.DataLoader is someone_elses and not is_patched()
    monkeypatch.undo()


def test_blocks_of_several_threads_leave_torch_as_they_found_it():
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(restarts: int) -> None:
        try:
            start.wait()
            for _ in range(20):
                with patched(max_restarts=restarts), _make() as guarded:
                    assert type(guarded) is GuardedLoader
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert torch.utils.data.DataLoader is TorchDataLoader and not is_patched()


def test_loaderdoctors_own_dataloader_works_while_patched():
    patch()
    with loaderdoctor.DataLoader(Pairs(21), batch_size=4, max_restarts=1) as guarded:
        assert type(guarded.loader) is TorchDataLoader and guarded.max_restarts == 1
