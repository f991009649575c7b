"""ranks_ceilings on a two-rank job simulated in one process (torch's HashStore standing for the job's store): the
main process reads every rank's ceiling and has the job's; a rank that hands none costs a bounded wait and a
warning, never a hang; a value too large or not a ceiling is refused with a warning; outside a distributed run
nothing is asked; a store taken while the process group was up is met in after it is gone, and watches that end in
another order on another rank meet their own (watch())."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import time

import pytest
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.tap.ceiling import Ceiling, Turn
from loaderdoctor.watch import rankceilings
from loaderdoctor.watch.rankceilings import job_ceiling_finding, ranks_ceilings


def _ceiling(real_s: float, free_s: float) -> Ceiling:
    turns = [
        Turn("real", 10, 10, real_s, real_s / 2),
        Turn("data-free", 5, 5, free_s / 2),
        Turn("real", 10, 10, real_s),
    ]
    return Ceiling(data_free_steps=5, refill=0, turns=turns)


@pytest.fixture
def job(monkeypatch):
    """A job of two ranks whose store is a HashStore; `job.rank` is this process's rank."""
    store = dist.HashStore()

    class Job:
        rank = 0

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_rank", lambda: Job.rank)
    monkeypatch.setattr(c10d, "_get_default_store", lambda: store)
    Job.store = store
    return Job


def _meeting_number(monkeypatch, number: int) -> None:
    """The next training's meeting is number `number` in this process."""
    monkeypatch.setattr(rankceilings, "_meetings", collections.defaultdict(itertools.count, training=iter([number])))


def _as_rank(job, rank: int, ceiling: Ceiling | None, **options):
    job.rank = rank
    return ranks_ceilings(ceiling, main=rank == 0, **options)


def test_the_main_process_reads_every_ranks_ceiling_and_has_the_jobs(job, monkeypatch):
    monkeypatch.setattr(rankceilings, "_meetings", collections.defaultdict(itertools.count))
    assert _as_rank(job, 1, _ceiling(2.0, 0.2)) is None  # a rank hands its own and goes on
    # rank 0 counts its trainings the same way
    monkeypatch.setattr(rankceilings, "_meetings", collections.defaultdict(itertools.count))
    job.rank = 0
    finding = job_ceiling_finding(_ceiling(1.0, 0.2), main=True)

    assert finding is not None and finding.rule == "job-ceiling"
    assert finding.evidence["ranks_measured"] == 2
    assert set(finding.evidence["input_cost_by_rank"]) == {"0", "1"}
    assert finding.evidence["real_batches_per_s"] == pytest.approx(20 / 4.0)  # the slowest rank's pace: rank 1


def test_a_rank_that_hands_no_ceiling_costs_a_bounded_wait_and_a_warning(job):
    started = time.monotonic()
    with pytest.warns(LoaderDoctorWarning, match=r"no ceiling from rank 1 within 0 s"):
        assert _as_rank(job, 0, _ceiling(1.0, 0.2), wait_s=0.3) is None
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("value", [b"x" * (rankceilings.MAX_BYTES + 1), b'{"turns": "none"}', b"not json"])
def test_a_ceiling_too_large_or_not_one_is_refused_with_a_warning(job, monkeypatch, value):
    _meeting_number(monkeypatch, 7)
    job.store.set("loaderdoctor/ceiling/training/7/1", value)
    with pytest.warns(LoaderDoctorWarning, match="could not gather the ranks' ceilings"):
        assert _as_rank(job, 0, _ceiling(1.0, 0.2), wait_s=1.0) is None


def test_a_rank_without_a_ceiling_is_left_out_of_the_jobs(job, monkeypatch):
    _meeting_number(monkeypatch, 3)
    job.store.set("loaderdoctor/ceiling/training/3/1", json.dumps(None))
    assert _as_rank(job, 0, _ceiling(1.0, 0.2), wait_s=1.0) == {0: _ceiling(1.0, 0.2)}


def test_outside_a_distributed_run_nothing_is_asked():
    assert not dist.is_initialized()
    assert ranks_ceilings(_ceiling(1.0, 0.2), main=True) is None


def test_a_ceiling_comes_back_as_it_was_handed(job, monkeypatch):
    handed = _ceiling(1.5, 0.3)
    handed.kept_length = "the loop's OneCycleLR"
    _meeting_number(monkeypatch, 5)
    job.store.set("loaderdoctor/ceiling/training/5/1", json.dumps(dataclasses.asdict(handed)))
    assert _as_rank(job, 0, None, wait_s=1.0) == {1: handed}


def test_a_job_store_taken_while_the_group_was_up_is_met_in_after_it_is_gone(monkeypatch):
    """watch() takes the job's store as its loop begins: its ranks meet at close() after destroy_process_group()."""
    assert not dist.is_initialized()
    store = dist.HashStore()
    rank1, rank0 = rankceilings.JobStore(store, 1, 2), rankceilings.JobStore(store, 0, 2)
    # rank 1 ends its watches of "val" and "train" in the other order than rank 0: each meets its own
    assert ranks_ceilings(_ceiling(9.0, 0.2), main=False, job=rank1, key="watch:val") is None
    assert ranks_ceilings(_ceiling(2.0, 0.2), main=False, job=rank1, key="watch:train") is None
    monkeypatch.setattr(rankceilings, "_meetings", collections.defaultdict(itertools.count))
    ceilings = ranks_ceilings(_ceiling(1.0, 0.2), main=True, job=rank0, key="watch:train")
    assert ceilings == {0: _ceiling(1.0, 0.2), 1: _ceiling(2.0, 0.2)}
    finding = job_ceiling_finding(_ceiling(1.0, 0.2), main=True, job=rank0, key="watch:val")

    assert finding is not None and finding.evidence["ranks_measured"] == 2
