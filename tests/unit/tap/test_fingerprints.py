"""One mechanism for repeated samples: the tap fingerprints an IterableDataset's batches, and the probe and a
watched run tally them per epoch alike, so that duplicate-samples is found by `run` as by `check`."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from loaderdoctor.loader.facts import LoaderFacts
from loaderdoctor.loader.settings import Settings
from loaderdoctor.rules import diagnose
from loaderdoctor.tap import iterator as tap_module
from loaderdoctor.tap.events import BatchDelivered, EpochEnded, Event, IteratorCreated
from loaderdoctor.tap.fingerprints import EpochTally, sample_fingerprints
from loaderdoctor.tap.iterator import Tap
from loaderdoctor.watch.recorder import RunRecorder
from shared_datasets import Stream


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _recorder(clock: Clock, workers: int = 2) -> RunRecorder:
    facts = LoaderFacts(
        batch_size=4,
        batches_per_epoch=None,  # a stream without len(): only the fingerprints can tell
        iterable=True,
        dataset="Stream",
        dataset_len=None,
    )
    return RunRecorder(facts, Settings(num_workers=workers), clock=clock)


def _batches(samples: int, copies: int) -> list[list[int]]:
    """The fingerprints of an epoch's batches of 4 as `copies` workers that each read the whole stream deliver
    them, one batch of each worker in turn."""
    per_worker = [list(range(i, min(i + 4, samples))) for i in range(0, samples, 4)]
    return [batch for batch in per_worker for _ in range(copies)]


def _epoch(recorder: RunRecorder, clock: Clock, epoch: int, batches: list[list[int]], *, ends: bool) -> None:
    recorder.on_event(IteratorCreated(epoch, None, [11, 12], 0.01))
    for index, fingerprints in enumerate(batches):
        clock.now += 0.001
        first = 0.01 if index == 0 else None
        recorder.on_event(BatchDelivered(epoch, index, 0.001, 0.0, 64, len(fingerprints), first, fingerprints))
        clock.now += 0.01
    if ends:
        recorder.on_event(EpochEnded(epoch, len(batches), 0.5, 0.001))


def test_a_watched_run_whose_two_workers_repeat_the_stream_is_told_duplicate_samples():
    clock = Clock()
    recorder = _recorder(clock)
    _epoch(recorder, clock, 0, _batches(64, copies=2), ends=True)
    _epoch(recorder, clock, 1, _batches(64, copies=2)[:10], ends=False)  # the loop leaves epoch 1 early...
    _epoch(recorder, clock, 2, _batches(64, copies=2)[:6], ends=False)  # ...and the run ends within epoch 2
    rec = recorder.finish()

    assert [e.ended for e in rec.epochs] == ["exhausted", "left", "time"]
    assert [e.samples_fingerprinted for e in rec.epochs] == [128, 40, 24]
    assert [e.distinct_samples for e in rec.epochs] == [64, 20, 12]
    assert [e.typical_copies for e in rec.epochs] == [2, 2, 2]
    finding = {f.rule: f for f in diagnose(rec)}["duplicate-samples"]
    assert finding.severity == "critical"
    assert finding.evidence["copies_of_each_sample"] == 2


def test_a_watched_run_whose_workers_split_the_stream_is_not_told_duplicate_samples():
    clock = Clock()
    recorder = _recorder(clock)
    for epoch in range(2):
        _epoch(recorder, clock, epoch, _batches(64, copies=1), ends=True)
    rec = recorder.finish()
    assert [e.typical_copies for e in rec.epochs] == [1, 1]
    assert "duplicate-samples" not in {f.rule for f in diagnose(rec)}


def _delivered(loader: DataLoader) -> list[BatchDelivered]:
    events: list[Event] = []
    tap = Tap(loader, [events.append], start_method=None)
    assert list(tap.epoch(0))
    return [e for e in events if isinstance(e, BatchDelivered)]


def test_the_tap_fingerprints_a_streams_batches_as_the_probe_did_and_a_map_style_datasets_not_at_all():
    delivered = _delivered(DataLoader(Stream(10, width=3), batch_size=4))
    assert [len(e.fingerprints or ()) for e in delivered] == [4, 4, 2]
    batches = list(DataLoader(Stream(10, width=3), batch_size=4))
    assert [e.fingerprints for e in delivered] == [sample_fingerprints(b, len(b)) for b in batches]

    assert [e.fingerprints for e in _delivered(DataLoader(torch.arange(10.0), batch_size=4))] == [None] * 3


def test_the_tap_stops_fingerprinting_an_epoch_past_its_limit(monkeypatch):
    monkeypatch.setattr(tap_module, "TALLIED_PER_EPOCH", 6)
    delivered = _delivered(DataLoader(Stream(20, width=3), batch_size=4))
    assert [len(e.fingerprints or ()) for e in delivered] == [4, 4, 0, 0, 0]


def test_a_tally_keeps_an_epochs_first_samples_only_and_records_them():
    tally = EpochTally(limit=5)
    tally.add([1, 1, 2])
    tally.add(None)
    tally.add([2, 3, 3, 4])
    assert tally.samples == 5  # 1, 1, 2, 2, 3: the rest past the limit is not kept
    assert tally.record_fields() == {"samples_fingerprinted": 5, "distinct_samples": 3, "typical_copies": 2}
    none = EpochTally().record_fields()
    assert none == {"samples_fingerprinted": 0, "distinct_samples": None, "typical_copies": None}


def test_tensors_numpy_cannot_hold_are_fingerprinted_and_those_without_rows_are_left_out():
    halves = torch.arange(12.0).reshape(4, 3).to(torch.bfloat16)
    found = sample_fingerprints(halves, 4)
    assert found is not None and len(set(found)) == 4
    assert sample_fingerprints(torch.eye(4).to_sparse(), 4) is None

    class Opaque:
        def __repr__(self) -> str:
            raise ValueError("no repr")

    # The tap fingerprints inside a watched training loop: a user's object is left out, never raised into it.
    found = sample_fingerprints({"key": ["a", "b", "a"], "obj": [Opaque()] * 3}, 3)
    assert found is not None and found[0] == found[2] != found[1]
