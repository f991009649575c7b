"""Torch's DataLoader and the guarded one side by side, on what torch documents: the same batches in the same
order, the same len(), the same errors, for fork, forkserver and spawn with 0, 1 and 2 workers."""

from __future__ import annotations

import gc
import os
import random

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, IterableDataset, RandomSampler, Sampler, get_worker_info
from torch.utils.data.dataloader import DataLoader as TorchDataLoader

import loaderdoctor

pytestmark = [pytest.mark.workers, pytest.mark.timeout(120)]

# (num_workers, start method): no workers, and each start method with 1 and 2 workers.
MATRIX = [(0, None)] + [(n, method) for method in ("fork", "forkserver", "spawn") for n in (1, 2)]
QUICK = [(0, None), (2, "fork")]


def _ids(case: tuple[int, str | None]) -> str:
    return f"{case[0]}-{case[1] or 'main'}"


def _options(case: tuple[int, str | None]) -> dict:
    workers, method = case
    return {"num_workers": workers, "multiprocessing_context": method} if workers else {}


class Augmented(Dataset):
    """Random augmentation in the loading process: torch's, python's and the worker's own draws."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        info = get_worker_info()
        worker = -1 if info is None else info.id
        return torch.tensor([index, float(torch.rand(())), random.random(), worker])


def _epochs(loader, count: int) -> list[list]:
    return [[batch.tolist() for batch in loader] for _ in range(count)]


def _both(dataset, epochs: int, make=dict, **kwargs) -> tuple[list, list]:
    """The batches of `epochs` epochs from torch's DataLoader and from loaderdoctor.DataLoader, built alike
    from `kwargs` and the options `make()` returns (made anew for each loader)."""

    def seeded() -> dict:
        options = {**kwargs, **make()}
        if options.pop("seeded", True):
            options["generator"] = torch.Generator().manual_seed(1234)
        return options

    torch.manual_seed(99), random.seed(99)
    plain = _epochs(TorchDataLoader(dataset, **seeded()), epochs)
    torch.manual_seed(99), random.seed(99)
    with loaderdoctor.DataLoader(dataset, **seeded()) as guarded:
        return plain, _epochs(guarded, epochs)


# Random augmentation over the whole matrix costs about 60 s of workers importing torch: `make test` runs no
# workers, both fork cases and two spawned workers; `make conformance` every case.
AUGMENTED = (
    MATRIX if os.environ.get("LOADERDOCTOR_FULL_MATRIX") == "1" else [(0, None), (1, "fork"), (2, "fork"), (2, "spawn")]
)


@pytest.mark.parametrize("case", AUGMENTED, ids=_ids)
def test_random_augmentation_in_workers_gives_the_plain_loaders_batches(case):
    plain, guarded = _both(Augmented(), 2, batch_size=4, shuffle=True, persistent_workers=False, **_options(case))
    assert guarded == plain


@pytest.mark.parametrize("case", [(2, "fork"), (2, "spawn")], ids=_ids)
def test_persistent_workers_over_epochs_give_the_plain_loaders_batches(case):
    plain, guarded = _both(Augmented(), 3, batch_size=4, shuffle=True, persistent_workers=True, **_options(case))
    assert guarded == plain


@pytest.mark.parametrize("case", [(2, "fork")], ids=_ids)
def test_persistence_the_guard_turns_on_keeps_the_first_epoch_and_says_what_changes(case):
    plain, guarded = _both(Augmented(), 2, batch_size=4, shuffle=True, **_options(case))
    assert guarded[0] == plain[0]
    assert [[sample[0] for sample in b] for b in guarded[1]] == [[sample[0] for sample in b] for b in plain[1]]
    with loaderdoctor.DataLoader(Augmented(), batch_size=4, **_options(case)) as loader:
        (event,) = loader.events
    assert "batches differ from the plain DataLoader's" in event.message and "persistent_workers=False" in event.message


@pytest.mark.parametrize("case", [(2, "fork")], ids=_ids)
def test_in_order_false_delivers_the_same_batches_in_the_plan_order(case):
    # torch may deliver them in any order; the guard keeps the plan's (it resumes by position), which in_order=False
    # allows: the same batches, as a multiset.
    plain, guarded = _both(Augmented(), 1, batch_size=4, shuffle=True, in_order=False, **_options(case))
    _, in_order = _both(Augmented(), 1, batch_size=4, shuffle=True, in_order=True, **_options(case))

    def batches(epoch: list) -> list:  # indices only: which worker loads a batch is torch's choice here
        return [[sample[0] for sample in batch] for batch in epoch]

    assert sorted(batches(guarded[0])) == sorted(batches(plain[0]))  # torch's batches
    assert batches(guarded[0]) == batches(in_order[0])  # in the plan's order


def _pairs(samples: list) -> dict:
    return {"index": torch.tensor([s[0] for s in samples]), "count": len(samples)}


def _seeded_sampler() -> RandomSampler:
    return RandomSampler(range(24), generator=torch.Generator().manual_seed(5))


# Each makes the options of one loader: a sampler's draws move its own generator, so each loader gets its own.
BATCHING = {
    "drop_last": lambda: {"batch_size": 5, "drop_last": True, "shuffle": True},
    "no-batching": lambda: {"batch_size": None, "shuffle": True},
    "batch_sampler": lambda: {"batch_sampler": BatchSampler(_seeded_sampler(), 7, False), "seeded": False},
    "sampler": lambda: {"batch_size": 4, "sampler": _seeded_sampler()},
    "prefetch_factor": lambda: {"batch_size": 3, "prefetch_factor": 4, "shuffle": True},
    "pin_memory": lambda: {"batch_size": 3, "pin_memory": True, "shuffle": True},
}


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
@pytest.mark.parametrize("case", QUICK, ids=_ids)
@pytest.mark.parametrize("name", BATCHING)
def test_samplers_and_batching_options_give_the_plain_loaders_batches(case, name):
    if name == "prefetch_factor" and not case[0]:
        pytest.skip("prefetch_factor needs workers (torch refuses it without)")
    plain, guarded = _both(Augmented(), 2, make=BATCHING[name], persistent_workers=False, **_options(case))
    assert guarded == plain


# Every batching option over the rest of the matrix costs about 100 s (each forkserver or spawn worker imports
# torch): `make test` runs a fork case of each, and a spawn case of those whose objects a spawned worker unpickles
# (a sampler, a batch sampler) or whose path differs (no batching); `make conformance` (LOADERDOCTOR_FULL_MATRIX=1)
# every case.
_REST = [c for c in MATRIX if c not in QUICK]
FULL = os.environ.get("LOADERDOCTOR_FULL_MATRIX") == "1"
REST = [
    (case, name)
    for case in (_REST if FULL else [(1, "fork"), (2, "spawn")])
    for name in BATCHING
    if FULL or case[1] != "spawn" or name in ("batch_sampler", "sampler", "no-batching")
]


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true but no accelerator")
@pytest.mark.parametrize(("case", "name"), REST, ids=[f"{name}-{_ids(case)}" for case, name in REST])
def test_every_batching_option_gives_the_plain_loaders_batches_for_each_start_method(case, name):
    # The rest of the matrix, one epoch of persistent workers each (the options' later epochs run above).
    plain, guarded = _both(Augmented(), 1, make=BATCHING[name], persistent_workers=True, **_options(case))
    assert guarded == plain


class NoteWorker:
    """A worker_init_fn that leaves a file per worker id it ran for (it runs in the worker's process)."""

    def __init__(self, folder) -> None:
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None and info.id == worker_id
        (self.folder / f"{worker_id}-of-{info.num_workers}").touch()


@pytest.mark.parametrize("case", QUICK, ids=_ids)
def test_a_custom_collate_and_worker_init_fn_see_what_they_see_under_torch(case, tmp_path):
    def collate(samples: list) -> dict:
        return _pairs(samples)

    ran = {"plain": tmp_path / "plain", "guarded": tmp_path / "guarded"}
    for folder in ran.values():
        folder.mkdir()

    def kwargs(who: str) -> dict:
        return {"batch_size": 5, "collate_fn": collate, "worker_init_fn": NoteWorker(ran[who]), **_options(case)}

    plain = [b["index"].tolist() for b in TorchDataLoader(Augmented(), **kwargs("plain"))]
    with loaderdoctor.DataLoader(Augmented(), **kwargs("guarded")) as guarded:
        assert [b["index"].tolist() for b in guarded] == plain
        assert len(guarded) == len(TorchDataLoader(Augmented(), **kwargs("plain"))) == 5
    names = {who: sorted(p.name for p in folder.iterdir()) for who, folder in ran.items()}
    assert names["guarded"] == names["plain"] == [f"{i}-of-{case[0]}" for i in range(case[0])]


class Forever(Sampler):
    """An endless sampler, as detectron2's TrainingSampler: no len(), never ends."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        generator = torch.Generator().manual_seed(0)
        while True:
            yield from torch.randperm(self.size, generator=generator).tolist()


class Counted(Sampler):
    """A sequential sampler over a huge dataset that counts what it has yielded."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.yielded = 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        for index in range(self.size):
            self.yielded += 1
            yield index


class Huge(Dataset):
    def __len__(self) -> int:
        return 200_000_000

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.parametrize("case", [*QUICK, (2, "spawn")], ids=_ids)
def test_an_endless_sampler_delivers_at_once_and_as_torch_does(case):
    kwargs = {"batch_size": 5, "sampler": Forever(24), **_options(case)}
    plain_iterator = iter(TorchDataLoader(Augmented(), **kwargs))
    plain = [next(plain_iterator)[:, 0].tolist() for _ in range(12)]
    del plain_iterator
    with loaderdoctor.DataLoader(Augmented(), **kwargs) as guarded:
        iterator = iter(guarded)
        assert [next(iterator)[:, 0].tolist() for _ in range(12)] == plain
        with pytest.raises(TypeError, match="len"):
            len(guarded)  # as torch: an endless sampler has no len()


@pytest.mark.parametrize("case", QUICK, ids=_ids)
def test_a_huge_dataset_draws_only_the_batches_asked_for(case):
    sampler = Counted(len(Huge()))
    with loaderdoctor.DataLoader(Huge(), batch_size=8, sampler=sampler, **_options(case)) as guarded:
        iterator = iter(guarded)
        assert next(iterator).tolist() == list(range(8))
        # The first batch and the workers' prefetch (prefetch_factor 2 per worker), not the epoch.
        assert sampler.yielded <= 8 * max(1, 2 * case[0]) + 8
        state = guarded.state_dict()
    assert len(str(state)) < 100_000  # the position and the generators' states, not the plan


class Split(IterableDataset):
    """Splits its range across workers as torch's documentation shows."""

    def __len__(self) -> int:
        return 10

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(10))
        return iter(range(info.id, 10, info.num_workers))


@pytest.mark.parametrize("case", QUICK, ids=_ids)
def test_an_iterable_dataset_without_state_dict_runs_as_torchs(case, recwarn, caplog):
    caplog.set_level("INFO", logger="loaderdoctor")
    kwargs = {"batch_size": 3, **_options(case)}
    plain = [b.tolist() for b in TorchDataLoader(Split(), **kwargs)]
    guarded = loaderdoctor.DataLoader(Split(), **kwargs)
    assert type(guarded) is TorchDataLoader  # torch's own loader, as it is
    assert [b.tolist() for b in guarded] == plain and len(guarded) == len(TorchDataLoader(Split(), **kwargs))
    assert not [w for w in recwarn if "loaderdoctor" in str(w.message)]  # logged, not warned (-W error safe)
    assert any("Split" in r.getMessage() for r in caplog.records)


class Typed(Dataset):
    """Answers, in a worker, whether get_worker_info().dataset is this very class."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> bool:
        info = get_worker_info()
        return info is not None and isinstance(info.dataset, Typed)


@pytest.mark.parametrize("case", [(1, "fork"), (1, "spawn")], ids=_ids)
def test_get_worker_info_shows_the_users_dataset(case):
    with loaderdoctor.DataLoader(Typed(), batch_size=2, **_options(case)) as guarded:
        assert [b.tolist() for b in guarded] == [[True, True], [True, True]]


class Crashes(Dataset):
    """Segfaults the process that loads sample 5, every time: only a worker may load it."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> int:
        if index == 5:
            import ctypes

            ctypes.string_at(0)  # a segfault, as a broken native decoder gives
        return index


@pytest.mark.timeout(180)
class NoConfig(Exception):
    """A user's own exception class, raised by a worker_init_fn."""


def _init_without_config(worker_id: int) -> None:
    raise NoConfig(f"no config for worker {worker_id}")


@pytest.mark.parametrize("case", [(2, "fork")], ids=_ids)
def test_a_failing_worker_init_fn_raises_its_own_class_as_under_torch(case):
    # torch re-raises a worker's exception in the main process as its own class: a loop's `except NoConfig`
    # must catch it the same under the guard (a class of loaderdoctor's in its place broke torch's own
    # test_error_in_init under patch()).
    kwargs = {"batch_size": 4, "worker_init_fn": _init_without_config, **_options(case)}
    assert "no config for worker" in _raised(NoConfig, TorchDataLoader(range(16), **kwargs))
    with loaderdoctor.DataLoader(range(16), **kwargs) as guarded:
        message = _raised(NoConfig, guarded)
    assert "no config for worker" in message
    assert "worker_init_fn raised NoConfig: no config for worker" in message  # where, for check's rules


def _raised(kind: type[Exception], loader) -> str:
    """The message of the `kind` error that iterating `loader` raises; the iterator (and its workers) let go of,
    which a traceback kept would not do."""
    try:
        list(loader)
    except kind as error:
        return str(error)
    finally:
        gc.collect()
    raise AssertionError(f"no {kind.__name__} was raised")


def test_a_sample_that_kills_its_worker_raises_in_the_main_process_as_torch_does(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # where the guard would leave a stack-dump folder
    kwargs = {"batch_size": 4, "num_workers": 1, "multiprocessing_context": "fork"}
    with pytest.raises(RuntimeError, match=r"killed by signal|exited unexpectedly"):
        list(TorchDataLoader(Crashes(), **kwargs))
    with loaderdoctor.DataLoader(Crashes(), **kwargs) as guarded:
        with pytest.raises(RuntimeError, match=r"killed by signal|exited unexpectedly") as raised:
            list(guarded)  # never loaded in this process: the test itself would die
        assert isinstance(raised.value, loaderdoctor.LoaderGaveUp)
        assert "it died loading dataset index 5" in str(raised.value)  # the sample, by its index
        assert all(s.num_workers >= 1 for s in guarded.tried)
        deaths = [e for e in guarded.events if e.kind == "worker-died"]
        assert deaths and all({"batch": 1, "indices": [4, 5, 6, 7]} in e.detail["in_hand"] for e in deaths)
        assert all(e.detail["index"] == 5 for e in deaths)
    assert list(tmp_path.glob("loaderdoctor-*")) == []  # no stack-dump folder left behind


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_sample_that_kills_its_worker_is_skipped_under_skip(method):
    kwargs = {"batch_size": 4, "num_workers": 1, "multiprocessing_context": method}
    with loaderdoctor.DataLoader(Crashes(), on_sample_error="skip", **kwargs) as guarded:
        batches = [b.tolist() for b in guarded]
        assert batches == [[0, 1, 2, 3], [4, 6, 6, 7], [8, 9, 10, 11]]  # 5 replaced by the next index, as a raise
        (death,) = [e for e in guarded.events if e.kind == "worker-died"]
        assert death.detail["index"] == 5
        (skipped,) = [e for e in guarded.events if e.kind == "sample-skipped"]
        assert skipped.detail["index"] == 5 and skipped.detail["error_type"] == "KilledItsWorker"
        assert guarded.restarts == 1 and guarded.settings.num_workers == 1  # the sample was the cause: same rung
        assert [b.tolist() for b in guarded] == batches  # and the next epoch never loads it again
        assert guarded.restarts == 1


class Slow(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 4:
            import time

            time.sleep(4)
        return index


@pytest.mark.timeout(60)
def test_the_users_timeout_raises_as_torchs_does():
    kwargs = {"batch_size": 2, "num_workers": 1, "multiprocessing_context": "fork", "timeout": 2}
    with pytest.raises(RuntimeError, match="timed out after 2 seconds"):
        list(TorchDataLoader(Slow(), **kwargs))
    with loaderdoctor.DataLoader(Slow(), **kwargs) as guarded:
        got = []
        with pytest.raises(RuntimeError, match="timed out after 2 seconds"):
            got.extend(b.tolist() for b in guarded)
        assert got == [[0, 1], [2, 3]] and guarded.restarts == 0


_REASSIGNED = """
import loaderdoctor
from torch.utils.data import Dataset

class Bad(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        if index == 5:
            raise ValueError("bad sample")
        return index

for _ in range(2):  # the second loader's forked workers hold a copy of the first, which they collect
    loader = loaderdoctor.DataLoader(Bad(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    try:
        list(loader)
    except ValueError:
        pass
loader.close()
"""


def test_a_loader_that_raised_and_was_replaced_ends_silently(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "reassigned.py"
    script.write_text(_REASSIGNED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr and "AssertionError" not in done.stderr, done.stderr


def test_signal_handlers_are_as_torch_leaves_them_once_guarded_workers_are_gone():
    import signal

    list(TorchDataLoader(Augmented(), batch_size=4, num_workers=1, multiprocessing_context="fork"))
    torchs = signal.getsignal(signal.SIGCHLD)  # torch sets its own once per process, and keeps it
    assert getattr(torchs, "__module__", "").startswith("torch.")  # torch's, not one an earlier test left
    with loaderdoctor.DataLoader(Augmented(), batch_size=4, num_workers=2, multiprocessing_context="fork") as guarded:
        list(guarded)
    assert signal.getsignal(signal.SIGCHLD) is torchs


def _peek_then_epochs(loader) -> list[list]:
    """A first batch looked at with next(iter(loader)), as notebooks and sanity checks do, then two epochs."""
    peeked = next(iter(loader)).tolist()
    return [[peeked], *_epochs(loader, 2)]


@pytest.mark.parametrize("case", QUICK, ids=_ids)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_peek_then_epochs_gives_the_plain_loaders_batches(case, persistent):
    if persistent and not case[0]:
        pytest.skip("persistent_workers needs workers")
    kwargs = {"batch_size": 4, "shuffle": True, "persistent_workers": persistent, **_options(case)}
    torch.manual_seed(99), random.seed(99)
    plain = _peek_then_epochs(TorchDataLoader(Augmented(), generator=torch.Generator().manual_seed(1234), **kwargs))
    torch.manual_seed(99), random.seed(99)
    with loaderdoctor.DataLoader(Augmented(), generator=torch.Generator().manual_seed(1234), **kwargs) as loader:
        guarded = _peek_then_epochs(loader)
    assert guarded == plain


def test_two_iterators_at_once_the_earlier_one_says_it_was_ended():
    # A documented difference: torch runs two iterators of one loader side by side (each with its own workers);
    # the guard runs one epoch at a time, so the earlier iterator raises a clear error instead of mixing epochs.
    with loaderdoctor.DataLoader(Augmented(), batch_size=4) as loader:
        first, second = iter(loader), iter(loader)
        assert len(next(second)) == 4
        with pytest.raises(loaderdoctor.UsageError, match="ended by iter\\(\\) of epoch 1"):
            next(first)
        assert sum(1 for _ in second) == 5  # the later one goes on
