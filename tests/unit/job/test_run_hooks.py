"""`loaderdoctor run`'s pieces in this process: its words split from the script's, the hooks on torch's DataLoader
(loaders named where the user's code made them, loaderdoctor's own iteration passed through, torch's methods
restored), a LoaderRun's JSON round trip, rank-straggler joined onto the slowest straggling rank's loader, and
distributed-sampler onto the lowest rank's."""

from __future__ import annotations

import sys

import pytest
import torch
from recordings import make_recording
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import DataLoader as TorchDataLoader

from loaderdoctor.commands.run import split_argv
from loaderdoctor.job.loaders import MAX_PER_SITE, EveryLoader, LoaderRun
from loaderdoctor.job.ranks import joined
from loaderdoctor.loader.settings import Settings
from loaderdoctor.report import LoaderReport
from loaderdoctor.watch import watch


def test_runs_words_end_where_the_script_begins():
    assert split_argv(["--guard", "train.py", "--guard", "--json", "x"]) == (
        ["--guard"],
        ["train.py", "--guard", "--json", "x"],
    )
    assert split_argv(["--nproc-per-node", "2", "--json=o.json", "-m", "pkg.train", "--lr", "3"]) == (
        ["--nproc-per-node", "2", "--json=o.json", "-m", "pkg.train"],
        ["--lr", "3"],
    )
    assert split_argv(["--name", "train.py"]) == (["--name", "train.py"], [])  # a value, not the script
    # an optional value: taken when it is one (a number of steps), else the next word is run's or the script's
    words = ["--ceiling", "--json", "o.json", "train.py"]
    assert split_argv(words) == (["--ceiling", "--json", "o.json"], ["train.py"])
    assert split_argv(["--ceiling", "30", "train.py", "3"]) == (["--ceiling", "30"], ["train.py", "3"])
    assert split_argv(["--ceiling", "train.py"]) == (["--ceiling"], ["train.py"])


def _line() -> int:
    return sys._getframe(1).f_lineno


def test_loaders_are_watched_by_where_they_were_made_and_torch_is_restored_after():
    every = EveryLoader()
    original = TorchDataLoader.__init__, TorchDataLoader.__iter__
    before = DataLoader(torch.arange(8), batch_size=2)  # made before: left alone
    every.install()
    try:
        line, loader = _line(), DataLoader(torch.arange(12), batch_size=4)
        assert type(loader) is TorchDataLoader and isinstance(loader, DataLoader)
        assert [len(b) for b in loader] == [4, 4, 4]
        assert list(before) and sum(len(b) for b in loader) == 12
    finally:
        runs = every.close()
    assert (TorchDataLoader.__init__, TorchDataLoader.__iter__) == original
    assert [run.report.name for run in runs] == [f"test_run_hooks.py:{line}"]
    assert runs[0].report.recording.epochs[-1].batches == 3 and len(runs[0].report.recording.epochs) == 2


def test_a_loader_the_script_watches_itself_is_left_to_that_watch():
    every = EveryLoader()
    every.install()
    try:
        own = watch(DataLoader(torch.arange(8), batch_size=2), "the-scripts-own", history=False)
        assert sum(len(b) for b in own) == 8
        report = own.close()
    finally:
        runs = every.close()
    assert runs == [] and report is not None and report.recording.epochs[0].batches == 4


def test_loaders_made_again_and_again_at_one_place_are_counted_and_bounded():
    every = EveryLoader(name="job", rank=1)
    every.install()
    try:
        for _ in range(MAX_PER_SITE + 2):
            line = _line() + 1
            assert len(list(DataLoader(torch.arange(4), batch_size=2))) == 2
    finally:
        runs = every.close()
    names = [run.report.name for run in runs]
    site = f"test_run_hooks.py:{line}"
    assert names[:2] == [f"job/{site}/rank1", f"job/{site}#2/rank1"] and len(names) == MAX_PER_SITE


def test_a_loader_run_loads_back_from_its_json():
    rec = make_recording(settings=Settings(num_workers=2), epochs=1, batches_per_epoch=10, wait_s=0.01, step_s=0.02)
    run = LoaderRun(LoaderReport("train.py:9", rec, []), "2026-11-25T10:00:00+00:00", {"hostname": "vm"})
    back = LoaderRun.from_dict(run.to_dict())
    assert back.report.name == "train.py:9" and back.started_at == run.started_at and back.host == run.host
    assert back.report.recording.batches == rec.batches


def _rank(name: str, wait_s: float, step_s: float, **fields) -> LoaderRun:
    rec = make_recording(settings=Settings(num_workers=2), epochs=2, batches_per_epoch=30, wait_s=wait_s,
                         step_s=step_s, **fields)  # fmt: skip
    return LoaderRun(LoaderReport(name, rec, []), "2026-11-25T10:00:00+00:00", {})


def test_rank_straggler_joins_the_straggling_ranks_loader_only_and_the_plan_rank_0s():
    sampled = {"dataset_len": 481, "batch_size": 8, "drop_last": False, "sampler_drop_last": False}
    ranks = [
        _rank("train.py:9/rank0", 0.004, 0.200, **sampled),
        _rank("train.py:9/rank1", 0.190, 0.015, **sampled),
        _rank("val.py:3/rank0", 0.004, 0.020),
        _rank("val.py:3/rank1", 0.005, 0.020),
    ]
    by_rank = {0: [ranks[0], ranks[2]], 1: [ranks[1], ranks[3]]}
    joined_ranks = joined(by_rank, {0: "a", 1: "b"}, 2)
    rules = {run.report.name: [f.rule for f in run.report.findings] for run in joined_ranks}
    assert rules == {"train.py:9/rank0": [], "train.py:9/rank1": ["rank-straggler"], "val.py:3/rank0": [],
                     "val.py:3/rank1": []}  # fmt: skip
    plans = {run.report.name: run.report.plan for run in joined_ranks}
    plan = plans.pop("train.py:9/rank0")
    assert plan is not None and (plan.world_size, plan.samples_per_rank, plan.repeated_samples) == (2, 241, 1)
    assert set(plans.values()) == {None}  # once per loader; none without a DistributedSampler (val)


def test_ranks_that_draw_the_same_indices_get_distributed_sampler_on_the_lowest_ranks_loader():
    whole = {"sampler": "RandomSampler", "sampler_distributed": False, "dataset_len": 480, "samples_per_epoch": 480}
    split = {
        "sampler": "DistributedSampler",
        "sampler_distributed": True,
        "dataset_len": 480,
        "sampler_drop_last": False,
    }
    own = {"sampler": "ShardSampler", "sampler_distributed": False, "dataset_len": 480}
    by_rank = {
        rank: [
            _rank(f"train.py:9/rank{rank}", 0.004, 0.020, drawn_indices=list(range(16, 480)), **whole),
            _rank(f"ddp.py:4/rank{rank}", 0.004, 0.020, drawn_indices=list(range(rank, 480, 4)), **split),
            _rank(f"shards.py:7/rank{rank}", 0.004, 0.020, drawn_indices=list(range(rank, 480, 4)), **own),
        ]
        for rank in (2, 3, 5)  # a node's ranks: the lowest is not always rank 0
    }
    joined_ranks = joined(by_rank, {2: "b", 3: "b", 5: "c"}, 8)
    rules = {run.report.name: [f.rule for f in run.report.findings] for run in joined_ranks}
    assert rules["train.py:9/rank2"] == ["distributed-sampler"]
    assert not [rule for name, found in rules.items() if name != "train.py:9/rank2" for rule in found]
    (finding,) = next(run for run in joined_ranks if run.report.name == "train.py:9/rank2").report.findings
    assert finding.severity == "critical" and finding.evidence["world_size"] == 3
    assert finding.title == "no DistributedSampler: each of the 3 ranks loads all 480 samples of the dataset"


def test_loaderdoctors_own_failure_leaves_the_loader_running_unwatched(monkeypatch, caplog):
    every = EveryLoader()

    def broken(loader, name, dispatcher):
        raise RuntimeError("a bug of loaderdoctor's")

    monkeypatch.setattr(every, "_make_watch", broken)
    every.install()
    try:
        assert [len(b) for b in DataLoader(torch.arange(10), batch_size=4)] == [4, 4, 2]
    finally:
        runs = every.close()
    assert runs == []
    assert "is not watched: RuntimeError: a bug of loaderdoctor's" in caplog.text


def test_a_missing_script_is_a_usage_error(tmp_path, monkeypatch, capsys):
    from loaderdoctor.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["run", "nowhere.py", "--guard"]) == 2
    assert "no such script: nowhere.py" in capsys.readouterr().err


def test_a_loader_the_guard_cannot_resume_is_watched_unguarded(caplog):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(6))

    every = EveryLoader(guarded=True)
    every.install()
    try:
        assert [len(b) for b in DataLoader(Stream(), batch_size=4)] == [4, 2]
    finally:
        runs = every.close()
    assert len(runs) == 1 and runs[0].report.recording.epochs[0].batches == 2
    assert "is watched, not guarded" in caplog.text


def test_accelerates_dispatcher_is_hooked_while_installed_and_put_back_after():
    accelerate = pytest.importorskip("accelerate.data_loader")
    dispatcher = accelerate.DataLoaderDispatcher
    original = dispatcher.__dict__["__iter__"]
    every = EveryLoader()
    every.install()
    try:
        assert dispatcher.__dict__["__iter__"] is not original
        assert dispatcher.__iter__.__wrapped__ is original
    finally:
        every.close()
    assert dispatcher.__dict__["__iter__"] is original


class _OwnWays(DataLoader):
    """A loader that makes and iterates itself without torch's DataLoader.__init__ or __iter__ (as torchdata's
    StatefulDataLoader does): its own attributes, then torch's iterator made by hand."""

    def __init__(self, data, batch_size):
        self.__dict__.update(DataLoader(data, batch_size=batch_size).__dict__)
        self.own_iters = 0

    def __iter__(self):
        self.own_iters += 1
        return self._get_iterator()


class _CallsSuper(_OwnWays):
    """A subclass of that one whose __iter__ goes through its base's: one watch, opened through the outermost."""

    def __iter__(self):
        self.mine = getattr(self, "mine", 0) + 1
        return super().__iter__()


def test_a_subclass_that_makes_and_iterates_itself_is_watched_named_and_put_back():
    every = EveryLoader()
    original = _OwnWays.__dict__["__init__"], _OwnWays.__dict__["__iter__"]
    every.install()
    try:

        class Later(_OwnWays):  # defined while the hooks are in: hooked as it is defined
            def __iter__(self):
                return super().__iter__()

        line, own = _line(), _OwnWays(torch.arange(12), 4)
        nested = _CallsSuper(torch.arange(8), 4)
        later = Later(torch.arange(4), 2)
        for _ in range(2):
            assert [len(b) for b in own] == [4, 4, 4]
        assert sum(len(b) for b in nested) == 8 and sum(len(b) for b in later) == 4
    finally:
        runs = every.close()
    assert (_OwnWays.__dict__["__init__"], _OwnWays.__dict__["__iter__"]) == original
    assert "__init_subclass__" not in TorchDataLoader.__dict__
    assert own.own_iters == 2 and nested.mine == 1 and nested.own_iters == 1  # each __iter__ once an epoch
    names = [run.report.name for run in runs]
    assert names == [f"test_run_hooks.py:{line}", f"test_run_hooks.py:{line + 1}", f"test_run_hooks.py:{line + 2}"]
    assert runs[0].report.recording.loader_class.endswith("test_run_hooks._OwnWays")
    assert [len(run.report.recording.epochs) for run in runs] == [2, 1, 1]
