"""distributed-sampler as run judges it, from what each rank's Recording kept (recorded_facts): ranks that drew
the same indices, or as many in common as ranks drawing from the whole dataset do by chance, are named; a
DistributedSampler, or a sampler of the user's that splits the indices, is not; too few indices to tell leave the
sampler's class to decide; a Recording that does not say its sampler is left out."""

from __future__ import annotations

import random

from recordings import make_recording

from loaderdoctor.rules.distributed import distributed_sampler, recorded_facts, shared_beyond_chance


def _rank(indices: list[int] | None, *, sampler: str = "SequentialSampler", distributed: bool = False, **fields):
    fields.setdefault("dataset_len", 1000)
    iterable = fields.pop("iterable", False)
    rec = make_recording(sampler=sampler, sampler_distributed=distributed, drawn_indices=indices, **fields)
    rec.iterable = iterable
    return rec


def _judged(ranks: dict[int, object]):
    return distributed_sampler({rank: facts for rank, rec in ranks.items() if (facts := recorded_facts(rec))})


def test_ranks_that_draw_the_same_indices_in_the_same_order_are_named():
    ranks = {rank: _rank(list(range(16, 400)), samples_per_epoch=1000) for rank in range(2)}
    finding = _judged(ranks)
    assert finding is not None and finding.rule == "distributed-sampler" and finding.severity == "critical"
    assert finding.title == "no DistributedSampler: each of the 2 ranks loads all 1000 samples of the dataset"
    assert finding.evidence["shared_samples_share"] == 1.0 and finding.evidence["indices_compared"] == 384
    assert "SequentialSampler gives every rank the whole dataset" in finding.fix


def test_ranks_whose_shuffles_differ_still_share_what_draws_from_the_whole_dataset_share():
    # a RandomSampler seeded apart on each rank: 2000 of 100_000 indices each, ~2% in common, as by chance
    ranks = {
        rank: _rank(random.Random(rank).sample(range(100_000), 2000), sampler="RandomSampler", dataset_len=100_000)
        for rank in range(4)
    }
    assert shared_beyond_chance({r: rec.drawn_indices for r, rec in ranks.items()}, 100_000) is True
    assert _judged(ranks) is not None


def test_a_distributed_sampler_or_a_split_of_the_users_own_is_not_named():
    split = {rank: _rank(list(range(rank, 1000, 2))[:300], sampler="ShardSampler") for rank in range(2)}
    assert _judged(split) is None
    ddp = {rank: _rank(list(range(rank, 1000, 2)), sampler="DistributedSampler", distributed=True) for rank in (0, 1)}
    assert _judged(ddp) is None
    # a split of a large dataset, shuffled: few indices in common by chance, none at all drawn
    shards = {rank: _rank(random.Random(rank).sample(range(rank, 100_000, 2), 2000), sampler="ShardSampler",
                          dataset_len=100_000) for rank in range(2)}  # fmt: skip
    assert shared_beyond_chance({r: rec.drawn_indices for r, rec in shards.items()}, 100_000) is False
    assert _judged(shards) is None


def test_too_few_indices_to_tell_leave_it_to_the_samplers_class():
    few = {rank: [rank * 7 + i for i in range(8)] for rank in range(2)}
    assert shared_beyond_chance(few, 1_000_000) is None
    whole = {rank: _rank(indices, sampler="RandomSampler", dataset_len=1_000_000) for rank, indices in few.items()}
    assert _judged(whole) is not None  # torch's RandomSampler gives every rank the whole dataset
    own = {rank: _rank(indices, sampler="ShardSampler", dataset_len=1_000_000) for rank, indices in few.items()}
    assert _judged(own) is None
    unnoted = {rank: _rank(None) for rank in range(2)}  # an iterator that is not torch's noted none
    assert _judged(unnoted) is not None and unnoted[0].sampler == "SequentialSampler"


def test_a_stream_every_rank_reads_whole_is_named_by_its_fingerprints():
    same = {rank: _rank(None, iterable=True, drawn_fingerprints=[11, 12, 13, 14]) for rank in range(2)}
    finding = _judged(same)
    assert finding is not None and finding.evidence["iterable"] is True
    split = {rank: _rank(None, iterable=True, drawn_fingerprints=[rank, rank + 2, rank + 4]) for rank in range(2)}
    assert _judged(split) is None


def test_ranks_that_take_different_numbers_of_steps_are_named():
    ranks = {
        0: _rank(None, distributed=True, batches_per_epoch=20),
        1: _rank(None, distributed=True, batches_per_epoch=19),
    }
    finding = _judged(ranks)
    assert finding is not None and "different numbers of steps" in finding.title


def test_a_recording_that_does_not_say_its_sampler_is_not_judged():
    assert recorded_facts(make_recording()) is None  # saved before the sampler was recorded, or the probe's
    facts = recorded_facts(_rank([3, 4], samples_per_epoch=500))
    assert facts is not None and (facts.sampler, facts.indices, facts.samples_per_epoch) == (
        "SequentialSampler",
        [3, 4],
        500,
    )
