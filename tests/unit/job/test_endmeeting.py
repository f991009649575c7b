"""The ranks' meeting at the end of a job that several `loaderdoctor run`s watch (job/endmeeting.py, job/places.py),
in a TCPStore on this machine's loopback: the other ranks' places are put there as theirs would be."""

from __future__ import annotations

from datetime import timedelta

import pytest
from recordings import make_recording
from torch.distributed import TCPStore

from loaderdoctor.job.endmeeting import meet_at_end, sent_key
from loaderdoctor.job.gathering import runs_text
from loaderdoctor.job.loaders import LoaderRun
from loaderdoctor.job.places import announce, place_key, this_place
from loaderdoctor.report import LoaderReport
from loaderdoctor.scale.launch import free_port
from loaderdoctor.watch.rankceilings import JobStore

HERE = this_place("/tmp/this-job")  # this process: a rank watched by the run of that job folder


@pytest.fixture
def store():
    return TCPStore("127.0.0.1", free_port(), None, True, timedelta(seconds=10), wait_for_workers=False)


def _runs(name: str) -> list[LoaderRun]:
    return [LoaderRun(LoaderReport(name, make_recording(), []), "2026-12-02T00:00:00+00:00", {})]


def _counting_clock():
    return iter(range(0, 1000)).__next__  # one second a poll


def test_rank_0_waits_only_for_the_ranks_another_run_watches_and_names_the_ones_that_never_came(store):
    announce(JobStore(store, 0, 6), HERE)
    store.set(place_key(1), "node-b\n/tmp/their-job")  # watched on another node: it sends
    store.set(sent_key(1), runs_text(_runs("t/rank1"), rank=1, host="node-b"))
    store.set(place_key(2), HERE)  # watched by this same run: its folder joins it
    store.set(place_key(3), "node-b\n/tmp/their-job")  # watched elsewhere, never sends (killed)
    # rank 4 was never watched; rank 5 is one this run holds already
    said = []
    zero = meet_at_end(JobStore(store, 0, 6), _runs("t/rank0"), {5}, here=HERE, say=said.append, wait_s=15,
                       clock=_counting_clock())  # fmt: skip
    assert sorted(zero.loaders) == [1] and zero.loaders[1][0].report.name == "t/rank1"
    assert zero.hosts == {1: "node-b"}
    assert zero.missing == [3] and zero.unwatched == [4]
    assert said and said[0].startswith("waiting for rank 3 to send what it measured")
    notes = zero.notes()
    assert any(note.startswith("rank 3 sent nothing within 15 s") for note in notes), notes
    assert any(note.startswith("rank 4 of the job's 6 was not watched") for note in notes), notes


def test_a_rank_sends_rank_0_what_it_measured_only_when_another_run_watches_it(store):
    store.set(place_key(0), "node-a\n/tmp/rank0s-job")
    one = meet_at_end(JobStore(store, 1, 3), _runs("t/rank1"), set(), here=HERE, say=print)
    assert one.sent and one.rank0_host == "node-a" and store.check([sent_key(1)])
    store.set(place_key(0), HERE)  # rank 0 watched by this very run: nothing to send
    two = meet_at_end(JobStore(store, 2, 3), _runs("t/rank2"), set(), here=HERE, say=print)
    assert not two.sent and not store.check([sent_key(2)]) and not two.notes()


def test_a_rank_whose_rank_0_was_never_watched_keeps_its_own_diagnosis_saying_so(store):
    one = meet_at_end(JobStore(store, 1, 2), _runs("t/rank1"), set(), here=HERE, say=print)
    assert not one.sent and not store.check([sent_key(1)])
    assert one.notes() == ["rank 0 was not watched under loaderdoctor run: this diagnosis is of this run's ranks only"]


def test_a_signal_noted_at_the_end_cuts_rank_0s_wait_short_with_what_came(store):
    store.set(place_key(1), "node-b\n/tmp/their-job")
    asked = []
    zero = meet_at_end(JobStore(store, 0, 2), _runs("t/rank0"), set(), here=HERE, say=print, wait_s=60,
                       clock=_counting_clock(), stopped=lambda: asked.append(1) or len(asked) > 2)  # fmt: skip
    assert zero.missing == [1] and len(asked) == 3
    assert "a signal ended the wait for the other ranks" in zero.notes()


def test_a_store_that_cannot_be_reached_leaves_the_rank_its_own_diagnosis(store):
    class Gone:
        def check(self, keys):
            raise RuntimeError("Connection reset by peer")

    one = meet_at_end(JobStore(Gone(), 1, 2), _runs("t/rank1"), set(), here=HERE, say=print)
    assert not one.sent and one.notes()[0].startswith("could not send what this rank measured to rank 0")


def test_a_rank_that_never_sent_its_end_is_diagnosed_from_what_it_sent_as_its_epochs_ended(store):
    from loaderdoctor.job.endmeeting import so_far_sent_key

    for rank in (1, 2):
        store.set(place_key(rank), "node-b\n/tmp/their-job")
    store.set(so_far_sent_key(1), runs_text(_runs("t/rank1"), rank=1, host="node-b", so_far=True))  # then killed
    zero = meet_at_end(JobStore(store, 0, 3), _runs("t/rank0"), set(), here=HERE, say=print, wait_s=5,
                       clock=_counting_clock())  # fmt: skip
    assert zero.missing == [1, 2] and sorted(zero.loaders) == [1] and zero.hosts == {1: "node-b"}
    seconds = make_recording().wall_s
    said = zero.notes()
    assert f"rank 1 sent nothing at its end within 5 s: its diagnosis covers its first {seconds:.1f} s" in said[0]
    assert zero.notes()[1].startswith("rank 2 sent nothing within 5 s")
