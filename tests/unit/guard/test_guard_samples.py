"""Bad samples under the guard, loading in the main process: "raise" names the index in an error of the
sample's own class; "skip" replaces the sample by the next index that loads, reports it exactly once, and ends
the run past max_bad_fraction. The wrapper and the report reader on their own too."""

from __future__ import annotations

import json
import logging
import pickle
import traceback

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.errors import LoaderDoctorError, UsageError
from loaderdoctor.guard import guard
from loaderdoctor.guard.samples import GuardedSamples, Request, SkipReports, Tagger, bad_share_floor, too_many_bad
from loaderdoctor.loader.indexed import SampleFailure, parse_sample_failures

pytestmark = pytest.mark.timeout(30)

SEED = 7


class Numbered(Dataset):
    """Returns its index; the listed indices raise ValueError."""

    def __init__(self, n: int, bad: set[int] = frozenset()) -> None:
        self.n = n
        self.bad = set(bad)
        self.loads = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        self.loads += 1
        if index in self.bad:
            raise ValueError(f"bad sample {index}")  # the line the original traceback shows
        return index


class BatchNumbered(Numbered):
    """Loads a whole batch at once; fails the batch when any of its samples is bad."""

    def __init__(self, n: int, bad: set[int] = frozenset()) -> None:
        super().__init__(n, bad)
        self.batch_loads = 0

    def __getitems__(self, indices: list[int]) -> list[int]:
        self.batch_loads += 1
        if self.bad & set(indices):
            raise RuntimeError("batch decode failed")
        return list(indices)


class NeedsTwoArguments(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")


class RaisesUnbuildable(Numbered):
    def __getitem__(self, index: int) -> int:
        if index in self.bad:
            raise NeedsTwoArguments("/data/7.jpg", "truncated")
        return index


def _shuffled(dataset: Dataset, **kwargs) -> DataLoader:
    return DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(SEED), **kwargs)


def _plain(n: int, replaced: dict[int, int]) -> list[list[int]]:
    """What the plain loader delivers from a fault-free dataset of n, with the replacements applied."""
    return [[replaced.get(i, i) for i in batch.tolist()] for batch in _shuffled(list(range(n)))]


def _skips(guarded) -> list[tuple[int, int, int]]:
    return [(e.batch, e.detail["index"], e.detail["replacement"]) for e in guarded.events if e.kind == "sample-skipped"]


# raise


def test_raise_names_the_index_in_an_error_of_the_samples_own_class():
    with guard(DataLoader(Numbered(12, bad={5, 6}), batch_size=4)) as guarded:
        batches = iter(guarded)
        assert next(batches).tolist() == [0, 1, 2, 3]
        with pytest.raises(ValueError) as raised:
            next(batches)
        assert [b.tolist() for b in batches] == [[8, 9, 10, 11]]  # the epoch goes on, as with the plain loader
        assert guarded.events == [] and guarded.skipped == []
    error = raised.value
    assert type(error) is ValueError
    assert str(error) == "dataset[5] raised ValueError: bad sample 5\ndataset[6] raised ValueError: bad sample 6"
    assert isinstance(error.__cause__, ValueError) and str(error.__cause__) == "bad sample 5"
    shown = "".join(traceback.format_exception(error))
    assert "# the line the original traceback shows" in shown and "in __getitem__" in shown


def test_raise_gives_a_sample_failure_when_the_class_needs_more_than_a_message():
    guarded = guard(DataLoader(RaisesUnbuildable(8, bad={7}), batch_size=4))
    with guarded, pytest.raises(SampleFailure) as raised:
        list(guarded)
    assert str(raised.value) == "dataset[7] raised NeedsTwoArguments: /data/7.jpg: truncated"
    assert isinstance(raised.value.__cause__, NeedsTwoArguments)


def test_raise_names_the_index_without_automatic_batching():
    guarded = guard(DataLoader(Numbered(4, bad={2}), batch_size=None))
    with guarded, pytest.raises(ValueError, match=r"^dataset\[2\] raised ValueError: bad sample 2$"):
        list(guarded)


# skip


def test_skip_replaces_each_bad_sample_by_the_next_index_that_loads(caplog):
    caplog.set_level(logging.WARNING, logger="loaderdoctor")
    replaced = {3: 4, 17: 19, 18: 19, 39: 0}  # 18 is bad too; 39 wraps to 0
    with guard(_shuffled(Numbered(40, bad=set(replaced))), on_sample_error="skip", max_bad_fraction=0.1) as guarded:
        got = [b.tolist() for b in guarded]
        assert got == _plain(40, replaced)
        assert all(len(b) == 4 for b in got)
        plan = _plain(40, {})
        expected = [(position, i, replaced[i]) for position, batch in enumerate(plan) for i in batch if i in replaced]
        assert _skips(guarded) == expected
        assert guarded.skipped == [i for _, i, _ in expected]
        (event, *_) = [e for e in guarded.events if e.detail["index"] == 17]
        assert event.epoch == 0 and event.detail["error_type"] == "ValueError"
        assert event.detail["message"] == "bad sample 17"
        assert "# the line the original traceback shows" in event.detail["traceback"]
        assert event.message == (
            f"loaderdoctor guard: sample 17 skipped at epoch 0, batch {event.batch}: ValueError: bad sample 17; "
            "sample 19 loaded in its place"
        )
    logged = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert logged == [e.message for e in guarded.events]


def test_skip_gives_the_same_batches_on_every_run_and_every_epoch():
    def run() -> tuple[list[list[list[int]]], list[int]]:
        with guard(_shuffled(Numbered(24, bad={2, 11})), on_sample_error="skip", max_bad_fraction=1) as guarded:
            epochs = [[b.tolist() for b in guarded] for _ in range(2)]
            return epochs, guarded.skipped

    first, second = run(), run()
    assert first == second
    assert sorted(first[1]) == [2, 2, 11, 11]  # once each time met: twice in two epochs


def test_skip_without_automatic_batching():
    with guard(DataLoader(Numbered(6, bad={2}), batch_size=None), on_sample_error="skip") as guarded:
        assert [int(s) for s in guarded] == [0, 1, 3, 3, 4, 5]
        assert guarded.skipped == [2] and _skips(guarded) == [(2, 2, 3)]


def test_skip_lets_a_batch_loading_dataset_load_its_good_batches_whole():
    dataset = BatchNumbered(12, bad={6})
    with guard(DataLoader(dataset, batch_size=4), on_sample_error="skip", max_bad_fraction=1) as guarded:
        assert [b.tolist() for b in guarded] == [[0, 1, 2, 3], [4, 5, 7, 7], [8, 9, 10, 11]]
        assert guarded.skipped == [6]
    assert dataset.batch_loads == 3 and dataset.loads == 5  # 4 one by one, then 7 in place of 6


def test_without_bad_samples_skip_yields_what_the_plain_loader_does():
    with guard(_shuffled(Numbered(21)), on_sample_error="skip") as guarded:
        assert [b.tolist() for b in guarded] == _plain(21, {})
        assert guarded.events == [] and guarded.skipped == []


def test_too_many_bad_samples_end_the_run_naming_them():
    # One sample in ten is bad (5, 15, 25, ...) against max_bad_fraction=0.02: the run ends at the first batch
    # where the share's 99.9% lower bound passes 2%, not before. The count goes on over the loader's life.
    dataset = Numbered(400, bad={i for i in range(400) if i % 10 == 5})
    with guard(DataLoader(dataset, batch_size=8), on_sample_error="skip", max_bad_fraction=0.02) as guarded:
        delivered = []
        with pytest.raises(LoaderDoctorError) as raised:
            delivered.extend(b.tolist() for b in guarded)
        seen = 8 * (len(delivered) + 1)
        bad = len(guarded.skipped)
        assert 0 < len(delivered) < 50 and guarded.skipped == list(range(5, 10 * bad, 10))
        assert too_many_bad(bad, seen, 0.02) and not too_many_bad(bad - 1, seen - 8, 0.02)
        with pytest.raises(LoaderDoctorError, match=rf"epoch 1, batch 0: {bad + 1} of the {seen + 8} samples seen"):
            list(guarded)
    message = raised.value.message
    assert message.startswith(
        f"the guarded DataLoader stopped at epoch 0, batch {len(delivered)}: {bad} of the {seen} samples seen failed"
    )
    assert f"a bad share of at least {bad_share_floor(bad, seen):.1%} (at 99.9% confidence)" in message
    assert "over max_bad_fraction=0.02" in message and "Bad indices: 5, 15, 25" in message
    assert "max_bad_fraction" in raised.value.hint


def test_a_few_bad_samples_met_early_do_not_end_the_run():
    # 0.3% bad against the default 1%: 2 of the first 128 samples are bad, which a share taken of at least 100
    # samples ended (2 > 1.28); over the loader's life the share stays under the limit.
    dataset = Numbered(1000, bad={3, 70, 500})
    with guard(DataLoader(dataset, batch_size=8), on_sample_error="skip") as guarded:
        for _ in range(3):
            assert len(list(guarded)) == 125
        assert guarded.skipped == [3, 70, 500] * 3


def test_the_bad_share_bound_is_the_exact_lower_end_then_wilsons():
    assert bad_share_floor(0, 100) == 0.0
    assert bad_share_floor(1, 3) == pytest.approx(1 - 0.999 ** (1 / 3), rel=1e-6)  # exact: 1 - (1 - p)^3 = 0.001
    assert bad_share_floor(2, 128) == pytest.approx(0.00036, abs=1e-5)  # 1.6% seen, could well be under 1%
    assert bad_share_floor(100, 1000) == pytest.approx(0.0744, abs=1e-3)  # Wilson's, above 50 bad samples
    assert bad_share_floor(50, 500) == pytest.approx(bad_share_floor(51, 510), abs=0.005)  # the two meet
    assert not too_many_bad(2, 128, 0.01) and too_many_bad(100, 1000, 0.05) and too_many_bad(1, 10**6, 0)


def test_max_bad_fraction_zero_ends_the_run_at_the_first_bad_sample():
    guarded = guard(DataLoader(Numbered(12, bad={9}), batch_size=4), on_sample_error="skip", max_bad_fraction=0)
    with guarded, pytest.raises(LoaderDoctorError, match=r"batch 2: 1 of the 12 samples seen failed.*Bad indices: 9\."):
        list(guarded)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"on_sample_error": "ignore"}, "on_sample_error must be one of 'raise', 'skip', not 'ignore'"),
        ({"max_bad_fraction": -0.1}, "max_bad_fraction must be a number from 0 to 1, not -0.1"),
        ({"max_bad_fraction": 1.5}, "max_bad_fraction must be a number from 0 to 1"),
        ({"max_bad_fraction": "0.1"}, "max_bad_fraction must be a number"),
        ({"max_bad_fraction": True}, "max_bad_fraction must be a number"),
    ],
)
def test_bad_sample_options_are_usage_errors(options, words):
    with pytest.raises(UsageError, match=words):
        guard(DataLoader(Numbered(4)), **options)


# The wrapper and the report reader


def _records(path) -> list[dict]:
    with open(path) as file:
        return [json.loads(line) for line in file]


def test_the_wrapper_reports_each_replacement_with_its_tag(tmp_path):
    reports = SkipReports(str(tmp_path))
    wrapped = GuardedSamples(Numbered(10, bad={4, 5, 9}), reports.path)
    assert wrapped.__getitems__(Request([3, 4, 5], (1, 0))) == [3, 6, 6]
    assert wrapped[Request(9, (1, 1))] == 0
    assert [(r["tag"], r["index"], r["replacement"]) for r in _records(reports.path)] == [
        ([1, 0], 4, 6),
        ([1, 0], 5, 6),
        ([1, 1], 9, 0),
    ]
    assert [r["index"] for r in reports.take((1, 0))] == [4, 5]
    assert [r["index"] for r in reports.take((1, 1))] == [9]


def test_the_wrapper_raises_when_no_index_can_replace():
    wrapped = GuardedSamples(Numbered(3, bad={0, 1, 2}), "/nonexistent/never-written")
    with pytest.raises(ValueError, match=r"dataset\[1\] raised ValueError: bad sample 1"):
        wrapped.__getitems__(Request([1], (1, 0)))
    tagged_keys = GuardedSamples({"a": 1}, "/nonexistent/never-written")
    with pytest.raises(KeyError, match=r"dataset\[b\] raised KeyError"):
        tagged_keys[Request("b", (1, 0))]  # no replacement rule for indices that are not integers


def test_untagged_requests_are_never_replaced(tmp_path):
    wrapped = GuardedSamples(Numbered(4, bad={1}), str(tmp_path / "reports"))
    assert wrapped.__getitems__([0, 2]) == [0, 2]
    with pytest.raises(ValueError, match=r"dataset\[1\]"):
        wrapped.__getitems__([0, 1])


def test_the_wrapper_passes_attributes_both_ways_and_pickles():
    inner = Numbered(4)
    wrapped = GuardedSamples(inner, "/tmp/reports")
    wrapped.handle = "opened in the worker"  # as a worker_init_fn does through get_worker_info().dataset
    assert inner.handle == "opened in the worker" and wrapped.n == 4
    copy = pickle.loads(pickle.dumps(wrapped))
    assert copy.report_path == "/tmp/reports" and copy.inner.handle == "opened in the worker"
    request = pickle.loads(pickle.dumps(Request([1, 2], (3, 4))))
    assert (request.index, request.tag) == ([1, 2], (3, 4))


def test_a_tagger_tags_each_batch_with_its_iterator_and_position():
    request = Tagger(iteration=5)(2, [4])
    assert (request.index, request.tag) == ([4], (5, 2))


def test_reports_of_batches_never_delivered_are_dropped(tmp_path):
    reports = SkipReports(str(tmp_path))

    def write(*records: dict) -> None:
        with open(reports.path, "a") as file:
            file.write("".join(json.dumps(r) + "\n" for r in records))

    write({"tag": [1, 3], "index": 30}, {"tag": [1, 5], "index": 50})  # iterator 1 loaded ahead, then ended
    assert reports.take((2, 3)) == []  # iterator 2: its own batch 3 had no bad sample
    write({"tag": [2, 5], "index": 51})
    with open(reports.path, "a") as file:
        file.write('{"tag": [2, 6], "ind')  # a record still being written
    assert reports.take((2, 5)) == [{"tag": [2, 5], "index": 51}]
    with open(reports.path, "a") as file:
        file.write('ex": 60}\n')
    assert reports.take((2, 6)) == [{"tag": [2, 6], "index": 60}]


def test_parse_finds_the_indices_in_what_the_wrapper_raises():
    wrapped = GuardedSamples(Numbered(8, bad={2, 3}))
    with pytest.raises(ValueError) as raised:
        wrapped.__getitems__([1, 2, 3])
    assert parse_sample_failures(raised.value) == [(2, "ValueError", "bad sample 2"), (3, "ValueError", "bad sample 3")]
