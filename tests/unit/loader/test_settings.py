"""Settings stay valid and turn into DataLoader arguments and code; LoaderSpec rebuilds a user's loader."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler, TensorDataset

from loaderdoctor.errors import UsageError
from loaderdoctor.loader.settings import LoaderSpec, Settings, _WorkerInit, default_start_method


def _dataset(n: int = 12) -> TensorDataset:
    return TensorDataset(torch.arange(n * 2, dtype=torch.float32).view(n, 2), torch.arange(n))


class _Counting(IterableDataset):
    def __iter__(self):
        return iter(range(7))


class _EvenThenOdd:
    """A batch sampler of its own: even indices in pairs, then odd ones in pairs."""

    def __iter__(self):
        yield [0, 2]
        yield [4, 6]
        yield [1, 3]

    def __len__(self) -> int:
        return 3


# Settings validation

THREADS_TAKE = "the thread backend takes num_workers (its threads, 1 or more) and prefetch_factor only"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"num_workers": -1}, "num_workers must be 0 or more, not -1"),
        ({"num_workers": 2, "start_method": "thread"}, "unknown start method 'thread'"),
        ({"backend": "greenlet"}, "unknown backend 'greenlet'"),
        ({"backend": "thread"}, THREADS_TAKE),
        ({"num_workers": 2, "backend": "thread", "persistent_workers": True}, THREADS_TAKE),
        ({"num_workers": 2, "backend": "thread", "start_method": "fork"}, THREADS_TAKE),
    ],
)
def test_invalid_settings_are_usage_errors(kwargs, words):
    with pytest.raises(UsageError) as raised:
        Settings(**kwargs)
    assert raised.value.message == words
    assert raised.value.exit_status == 2


def test_unknown_start_method_hint_lists_the_valid_ones():
    with pytest.raises(UsageError) as raised:
        Settings(num_workers=1, start_method="vfork")
    assert raised.value.hint == "use one of fork, forkserver, spawn"


def test_replace_validates_too():
    with pytest.raises(UsageError):
        Settings().replace(num_workers=-3)


def test_replace_to_zero_workers_drops_worker_only_settings_but_keeps_pin_memory():
    busy = Settings(
        num_workers=4,
        prefetch_factor=8,
        persistent_workers=True,
        pin_memory=True,
        start_method="spawn",
        worker_threads=2,
    )
    assert busy.replace(num_workers=0) == Settings(num_workers=0, pin_memory=True)


def test_replace_with_workers_keeps_the_rest():
    before = Settings(num_workers=2, persistent_workers=True, start_method="forkserver")
    after = before.replace(num_workers=6)
    assert after == Settings(num_workers=6, persistent_workers=True, start_method="forkserver")
    assert before.num_workers == 2  # frozen: a copy, not a change


def test_dict_round_trip():
    settings = Settings(num_workers=3, prefetch_factor=4, start_method="spawn", worker_threads=1)
    assert Settings.from_dict(settings.to_dict()) == settings
    assert settings.to_dict()["prefetch_factor"] == 4


# to_kwargs and snippet


def test_to_kwargs_without_workers_leaves_out_worker_arguments():
    assert Settings(pin_memory=True).to_kwargs() == {"num_workers": 0, "pin_memory": True}


def test_to_kwargs_with_workers_fills_in_the_default_prefetch():
    kwargs = Settings(num_workers=3, persistent_workers=True, start_method="spawn").to_kwargs()
    assert kwargs == {
        "num_workers": 3,
        "prefetch_factor": 2,
        "persistent_workers": True,
        "pin_memory": False,
        "multiprocessing_context": "spawn",
    }
    assert Settings(num_workers=1, prefetch_factor=6).to_kwargs()["prefetch_factor"] == 6


@pytest.mark.parametrize(
    "settings",
    [
        Settings(),
        Settings(pin_memory=True),
        Settings(num_workers=2),
        Settings(num_workers=2, prefetch_factor=4, persistent_workers=True, start_method="forkserver"),
    ],
)
def test_dataloader_accepts_to_kwargs(settings):
    loader = DataLoader(_dataset(), batch_size=4, **settings.to_kwargs())  # no iter(): no workers start
    assert loader.num_workers == settings.num_workers
    assert bool(loader.persistent_workers) == settings.persistent_workers
    if settings.num_workers:
        assert loader.prefetch_factor == (settings.prefetch_factor or 2)


def test_snippet_without_workers():
    assert Settings().snippet() == "loader = DataLoader(dataset, batch_size=...)"
    assert Settings(pin_memory=True).snippet() == "loader = DataLoader(dataset, batch_size=..., pin_memory=True)"


def test_snippet_with_workers_names_every_changed_setting():
    snippet = Settings(num_workers=2, persistent_workers=True, prefetch_factor=4, start_method="forkserver").snippet()
    assert snippet == (
        "loader = DataLoader(dataset, batch_size=..., num_workers=2, persistent_workers=True, prefetch_factor=4, "
        "multiprocessing_context='forkserver')"
    )


def test_snippet_leaves_out_the_default_prefetch():
    assert "prefetch_factor" not in Settings(num_workers=2, prefetch_factor=2).snippet()


def test_snippet_defines_worker_init_fn_when_limiting_threads():
    snippet = Settings(num_workers=2, worker_threads=1).snippet()
    lines = snippet.splitlines()
    assert lines[0].startswith("def worker_init_fn(worker_id):")
    assert "    torch.set_num_threads(1)  # torch's own pool (OpenMP)" in lines
    assert '        sys.modules["cv2"].setNumThreads(1)' in lines  # OpenCV's pool, where it is loaded
    assert lines[-1] == "loader = DataLoader(dataset, batch_size=..., num_workers=2, worker_init_fn=worker_init_fn)"
    compile(snippet, "<snippet>", "exec")  # paste-ready: at least valid Python


def test_every_snippet_is_valid_python():
    for settings in (Settings(), Settings(num_workers=8, start_method="spawn", pin_memory=True, worker_threads=2)):
        compile(settings.snippet(), "<snippet>", "exec")


# start methods


def test_effective_start_method(monkeypatch):
    assert Settings().effective_start_method is None
    assert Settings(num_workers=2, start_method="spawn").effective_start_method == "spawn"
    monkeypatch.setattr("loaderdoctor.loader.settings.default_start_method", lambda: "forkserver")
    assert Settings(num_workers=2).effective_start_method == "forkserver"


def test_default_start_method_does_not_fix_the_start_method():
    before = multiprocessing.get_start_method(allow_none=True)
    method = default_start_method()
    assert multiprocessing.get_start_method(allow_none=True) == before
    assert method in multiprocessing.get_all_start_methods()
    if before is None:
        assert method == multiprocessing.get_all_start_methods()[0]
    else:
        assert method == before


# LoaderSpec


def test_from_loader_with_batch_size_and_shuffle():
    loader = DataLoader(_dataset(), batch_size=4, shuffle=True, drop_last=True)
    spec = LoaderSpec.from_loader(loader)
    assert spec.batch_size == 4
    assert spec.drop_last is True
    assert isinstance(spec.sampler, RandomSampler)
    assert spec.settings == Settings()
    assert not spec.is_iterable
    rebuilt = spec.build(Settings())
    batches = list(rebuilt)
    assert len(batches) == 3
    assert all(b[0].shape == (4, 2) for b in batches)
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == list(range(12))


def test_from_loader_reads_worker_settings_and_start_method():
    loader = DataLoader(
        _dataset(),
        batch_size=2,
        num_workers=2,
        prefetch_factor=5,
        persistent_workers=True,
        pin_memory=True,
        multiprocessing_context="spawn",
    )
    spec = LoaderSpec.from_loader(loader)
    assert spec.settings == Settings(
        num_workers=2, prefetch_factor=5, persistent_workers=True, pin_memory=True, start_method="spawn"
    )


def test_from_loader_without_batching():
    loader = DataLoader(_dataset(5), batch_size=None)
    spec = LoaderSpec.from_loader(loader)
    assert spec.batch_size is None
    assert spec.batch_sampler is None
    items = list(spec.build(Settings()))
    assert len(items) == 5
    assert torch.equal(items[3][0], torch.tensor([6.0, 7.0]))


def test_from_loader_with_a_batch_sampler_of_its_own():
    sampler = _EvenThenOdd()
    loader = DataLoader(_dataset(), batch_sampler=sampler)
    spec = LoaderSpec.from_loader(loader)
    assert spec.batch_sampler is sampler
    assert spec.batch_size is None
    labels = [b[1].tolist() for b in spec.build(Settings())]
    assert labels == [[0, 2], [4, 6], [1, 3]]


def test_from_loader_with_an_iterable_dataset():
    loader = DataLoader(_Counting(), batch_size=3)
    spec = LoaderSpec.from_loader(loader)
    assert spec.is_iterable
    assert spec.batch_size == 3
    assert [b.tolist() for b in spec.build(Settings())] == [[0, 1, 2], [3, 4, 5], [6]]


def test_from_loader_iterable_keeps_drop_last():
    spec = LoaderSpec.from_loader(DataLoader(_Counting(), batch_size=3, drop_last=True))
    assert [b.tolist() for b in spec.build(Settings())] == [[0, 1, 2], [3, 4, 5]]


def test_build_yields_the_same_batches_as_the_original():
    original = DataLoader(_dataset(10), batch_size=3, sampler=SequentialSampler(range(10)))
    rebuilt = LoaderSpec.from_loader(original).build(Settings())
    expected, got = list(original), list(rebuilt)
    assert len(got) == len(expected) == 4
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want[0], have[0])
        assert torch.equal(want[1], have[1])


def test_build_with_a_replacement_dataset():
    spec = LoaderSpec.from_loader(DataLoader(_dataset(4), batch_size=2))
    other = TensorDataset(torch.full((4, 1), 7.0))
    assert [b[0].tolist() for b in spec.build(Settings(), dataset=other)] == [[[7.0], [7.0]], [[7.0], [7.0]]]


def test_build_with_workers_makes_a_worker_loader_without_starting_it():
    spec = LoaderSpec.from_loader(DataLoader(_dataset(), batch_size=4, timeout=7.0))
    loader = spec.build(Settings(num_workers=2, worker_threads=1, start_method="spawn"))
    assert loader.num_workers == 2
    assert loader.timeout == 7.0
    assert isinstance(loader.worker_init_fn, _WorkerInit)
    assert loader.worker_init_fn.worker_threads == 1
    # A batch sampler was made by the original loader from batch_size; the rebuild reuses it.
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.batch_size == 4


def test_from_loader_of_something_else_is_a_usage_error():
    with pytest.raises(UsageError, match=r"expected a torch.utils.data.DataLoader, got builtins.list"):
        LoaderSpec.from_loader([1, 2, 3])


# _WorkerInit


def test_worker_init_runs_hook_then_user_fn_then_limits_threads():
    calls = []
    threads_before = torch.get_num_threads()
    limit = 1 if threads_before != 1 else 2
    init = _WorkerInit(
        user_fn=lambda wid: calls.append(("user", wid, torch.get_num_threads())),
        worker_threads=limit,
        hook=lambda wid: calls.append(("hook", wid, torch.get_num_threads())),
    )
    try:
        init(5)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads_before)
    assert calls == [("hook", 5, threads_before), ("user", 5, threads_before)]
    assert after == limit


def test_worker_init_without_thread_limit_leaves_threads_alone():
    calls = []
    threads_before = torch.get_num_threads()
    _WorkerInit(user_fn=None, worker_threads=None, hook=calls.append)(2)
    assert calls == [2]
    assert torch.get_num_threads() == threads_before


# The thread backend


def test_thread_settings_without_threads_fall_back_to_the_main_process():
    threads = Settings(num_workers=4, prefetch_factor=2, backend="thread")
    assert threads.effective_start_method is None
    assert threads.replace(num_workers=0) == Settings()


def test_the_thread_backend_gives_the_plain_loaders_batches_in_order():
    spec = LoaderSpec.from_loader(DataLoader(_dataset(12), batch_size=5))
    plain = [batch[1].tolist() for batch in spec.build(Settings())]
    threaded = spec.build(Settings(num_workers=3, prefetch_factor=2, backend="thread"))
    assert len(threaded) == 3
    assert [batch[1].tolist() for batch in threaded] == plain


def test_the_thread_backend_without_batching_yields_single_samples():
    spec = LoaderSpec.from_loader(DataLoader(_dataset(4), batch_size=None))
    samples = list(spec.build(Settings(num_workers=2, prefetch_factor=2, backend="thread")))
    assert [int(sample[1]) for sample in samples] == [0, 1, 2, 3]


def test_the_thread_backend_refuses_an_iterable_dataset():
    spec = LoaderSpec.from_loader(DataLoader(_Counting(), batch_size=2))
    with pytest.raises(UsageError, match="map-style datasets only"):
        spec.build(Settings(num_workers=2, prefetch_factor=2, backend="thread"))


def test_the_thread_snippet_builds_the_loader_tune_measured():
    snippet = Settings(num_workers=8, prefetch_factor=4, backend="thread").snippet()
    assert "loader = ThreadLoader(dataset, batch_size=..., num_workers=8, prefetch_factor=4)" in snippet
    code = compile(snippet.replace("batch_size=...", "batch_size=2"), "<snippet>", "exec")
    scope = {"dataset": list(range(5))}
    exec(code, scope)
    assert [batch.tolist() for batch in scope["loader"]] == [[0, 1], [2, 3], [4]]
