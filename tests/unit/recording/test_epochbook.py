"""EpochBook: the tap's events become the same batch and epoch records for the probe and a watched run."""

from __future__ import annotations

import pytest
from recordings import make_recording

from loaderdoctor.recording.epochbook import EpochBook
from loaderdoctor.recording.record import startup_batches, steady_batches
from loaderdoctor.tap.events import BatchDelivered, BatchFailed, IteratorCreated


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _book() -> tuple[EpochBook, Clock]:
    clock = Clock()
    rec = make_recording()
    rec.batches, rec.epochs, rec.windows = [], [], []
    return EpochBook(rec, clock, clock.now), clock


def _deliver(book: EpochBook, clock: Clock, epoch: int, index: int, first_batch_s: float | None = None) -> None:
    clock.now += 0.1
    book.rec.batches.append(book.delivered(BatchDelivered(epoch, index, 0.1, 0.0, 64, 4, first_batch_s), clock.now))


def test_an_epoch_that_starts_workers_counts_one_start_up_batch_per_worker_and_keeps_its_iter_time():
    book, clock = _book()
    clock.now += 0.5  # iter() took 0.5 s: the epoch began when it was called
    opened = book.created(IteratorCreated(0, None, [11, 12, 13], 0.5))
    assert (opened.startup, opened.started, opened.iter_s) == (3, 100.0, 0.5)
    _deliver(book, clock, 0, 0, first_batch_s=0.6)
    for index in range(1, 5):
        _deliver(book, clock, 0, index)
    record = book.close("exhausted", end_s=0.01)
    assert record is not None and book.open is None
    assert (record.batches, record.first_batch_s, record.iter_s, record.end_s) == (5, 0.6, 0.5, 0.01)
    assert record.wall_s == pytest.approx(clock.now - 100.0) and record.started_s == 0.0
    assert [b.delivered_s for b in book.rec.batches] == pytest.approx([0.6, 0.7, 0.8, 0.9, 1.0])
    # Persistent workers (the same pids) start nothing: only the next epoch's first batch is start-up.
    assert book.created(IteratorCreated(1, None, [11, 12, 13], 0.0)).startup == 1
    book.close("exhausted")
    assert startup_batches(book.rec) == {0: 3, 1: 1}  # the same rule, read back from the records
    assert [b.index for b in steady_batches(book.rec)] == [3, 4]


def test_the_start_up_ends_with_the_first_batch_of_the_last_worker_the_epoch_started():
    book, clock = _book()
    book.created(IteratorCreated(0, None, [11, 12], 0.0))
    ended = []
    for index in range(4):
        _deliver(book, clock, 0, index, first_batch_s=0.2 if index == 0 else None)
        ended.append(book.startup_just_ended())
    assert ended == [False, True, False, False]  # batch 1: both workers have delivered their first
    book.close("exhausted")
    book.created(IteratorCreated(1, None, [11, 12], 0.0))  # persistent: no worker started
    _deliver(book, clock, 1, 0, first_batch_s=0.01)
    assert not book.startup_just_ended()
    book.close("exhausted")
    book.created(IteratorCreated(2, None, [], 0.0))  # loading in the main process
    _deliver(book, clock, 2, 0, first_batch_s=0.01)
    assert not book.startup_just_ended()


def test_a_failed_batch_keeps_its_place_in_the_epochs_numbering():
    book, clock = _book()
    book.created(IteratorCreated(0, None, [], 0.0))
    _deliver(book, clock, 0, 0, first_batch_s=0.1)
    assert book.failed(BatchFailed(0, 1, 0.0, ValueError("bad"))) == 1
    _deliver(book, clock, 0, 2)
    book.restarted(IteratorCreated(0, None, [21], 0.0))  # a guard's new iterator: its own count starts at 0
    _deliver(book, clock, 0, 0)
    assert [b.index for b in book.rec.batches] == [0, 2, 3]
    assert book.open is not None and (book.open.batches, book.open.failed, book.open.restarts) == (3, 1, 1)


def test_a_batch_with_no_iter_seen_opens_its_epoch_and_closing_none_is_nothing():
    book, clock = _book()
    assert book.close("time") is None
    _deliver(book, clock, 4, 7)  # a tap made mid-epoch
    record = book.close("time", at=clock.now + 1.0)
    assert record is not None and (record.epoch, record.batches, record.worker_pids) == (4, 1, [])
    assert record.wall_s == pytest.approx(1.1)  # from the batch's wait's start to the given end
