"""One description of a loader (loader/facts.py) for the probe, the watch and scale: what it reads of a loader,
"len() or None" once, the epoch's indices drawn only when asked, and the public paths that moved beside it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from loaderdoctor.loader.facts import LoaderFacts, length_or_none, loader_facts
from loaderdoctor.loader.settings import Settings
from loaderdoctor.scale.results import RankLoader
from loaderdoctor.watch.recorder import RunRecorder
from shared_datasets import Stream


class BrokenLength:
    def __len__(self) -> int:
        raise ValueError("the dataset's own bug")


def test_len_or_none_is_the_length_none_without_one_and_lets_other_errors_through():
    assert length_or_none([1, 2, 3]) == 3
    assert length_or_none(Stream(6)) is None
    with pytest.raises(ValueError, match="own bug"):
        length_or_none(BrokenLength())


def test_a_map_style_loader_with_a_distributed_sampler_is_described_whole():
    data = TensorDataset(torch.arange(10))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=False, drop_last=True)
    facts = loader_facts(DataLoader(data, batch_size=2, sampler=sampler, drop_last=True), indices=True)
    assert facts == LoaderFacts(
        batch_size=2,
        batches_per_epoch=2,  # 5 samples of rank 1, in batches of 2, the last one dropped
        iterable=False,
        dataset="TensorDataset",
        dataset_len=10,
        drop_last=True,
        sampler="DistributedSampler",
        distributed=True,
        sampler_drop_last=True,
        samples_per_epoch=5,  # rank 1's share of the 10
        indices=[1, 3, 5, 7],  # as its batches give them: 9 went with the partial batch
    )


def test_a_stream_has_no_lengths_and_no_indices_even_when_asked():
    facts = loader_facts(DataLoader(Stream(6), batch_size=2), indices=True)
    assert (facts.iterable, facts.batches_per_epoch, facts.dataset_len, facts.indices) == (True, None, None, None)
    assert (facts.dataset, facts.distributed, facts.sampler_drop_last) == ("Stream", False, None)


def test_the_epochs_indices_are_drawn_only_when_asked_so_the_watch_leaves_the_users_generator_alone():
    loader = DataLoader(TensorDataset(torch.arange(50)), batch_size=5, shuffle=True)
    before = torch.get_rng_state()
    facts = loader_facts(loader)
    assert facts.indices is None
    assert torch.equal(torch.get_rng_state(), before)
    drawn = loader_facts(loader, indices=True)
    assert sorted(drawn.indices or []) == list(range(50))
    assert not torch.equal(torch.get_rng_state(), before)  # as an epoch would, it took a seed


def test_scale_and_the_watch_read_the_same_facts():
    data = TensorDataset(torch.arange(12))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=3, rank=0))
    facts = loader_facts(loader)
    rec = RunRecorder(facts, Settings()).rec
    assert (rec.batch_size, rec.batches_per_epoch, rec.dataset, rec.dataset_len, rec.sampler_drop_last) == (
        4, 1, "TensorDataset", 12, False,
    )  # fmt: skip
    assert dataclasses.fields(RankLoader)[1].type in ("LoaderFacts", LoaderFacts)
    written = json.loads(json.dumps(dataclasses.asdict(facts)))
    assert LoaderFacts.from_dict(written) == facts


def test_the_moved_names_keep_their_public_paths():
    import loaderdoctor
    from loaderdoctor.loader import ddp
    from loaderdoctor.probe.verification import Verification
    from loaderdoctor.report import Finding as ReportFinding
    from loaderdoctor.report import Verification as ReportVerification
    from loaderdoctor.rules.finding import Finding
    from loaderdoctor.scale.plan import DdpPlan, SameEffectiveBatch, ddp_plan

    assert loaderdoctor.Finding is ReportFinding is Finding
    assert loaderdoctor.Verification is ReportVerification is Verification
    assert (ddp_plan, DdpPlan, SameEffectiveBatch) == (ddp.ddp_plan, ddp.DdpPlan, ddp.SameEffectiveBatch)
