"""Rules about how a distributed run's ranks split and shuffle the samples (distributed-sampler): across the
ranks of scale and of run, from what each rank's loader is and gave (loader.facts.LoaderFacts: scale draws an
epoch of indices from each rank's sampler; run keeps what each rank's first epoch drew, recorded_facts); and in a
watched run, from the epochs its sampler held (a shuffle that never changes because set_epoch() is never
called)."""

from __future__ import annotations

from loaderdoctor.loader.facts import LoaderFacts
from loaderdoctor.plain.words import percent, plural
from loaderdoctor.recording.record import Recording
from loaderdoctor.rules.finding import Finding

# Ranks that share more than this of the samples that ranks each drawing from the whole dataset would share load
# the same data (all of them, when each drew a whole epoch): a split leaves only its padding.
DUPLICATE_SHARE = 0.5
# Fewer indices than this shared by such ranks, by chance, and the indices cannot tell a split from none (a short
# run of a large dataset): the sampler's class decides.
MIN_EXPECTED_SHARED = 20
# torch's samplers that give every rank the whole dataset, whatever the indices show.
WHOLE_DATASET_SAMPLERS = ("SequentialSampler", "RandomSampler")

MAP_STYLE_SNIPPET = """\
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sampler = DistributedSampler(dataset, shuffle=True)  # rank and world size from the process group
loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers)
for epoch in range(epochs):
    sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    for batch in loader:
        ..."""

ITERABLE_SNIPPET = """\
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

class Shards(IterableDataset):
    def __iter__(self):
        worker = get_worker_info()
        workers = worker.num_workers if worker else 1
        # one slice of the stream per (rank, worker): no two read the same items
        part = dist.get_rank() * workers + (worker.id if worker else 0)
        parts = dist.get_world_size() * workers
        for i, item in enumerate(self.items()):
            if i % parts == part:
                yield item"""


def shared_share(ranks: dict[int, list[int]]) -> float | None:
    """Of each rank's samples (indices or fingerprints), the share that another rank got too, averaged over the
    ranks; None with fewer than two ranks that have any."""
    filled = {rank: set(items) for rank, items in ranks.items() if items}
    if len(filled) < 2:
        return None
    shares = []
    for rank, mine in filled.items():
        others = set().union(*(items for other, items in filled.items() if other != rank))
        shares.append(len(mine & others) / len(mine))
    return sum(shares) / len(shares)


def shared_beyond_chance(ranks: dict[int, list[int]], dataset_len: int | None) -> bool | None:
    """Whether the ranks' indices overlap as those of ranks that each draw from the whole dataset of
    `dataset_len` samples do (more than DUPLICATE_SHARE of the overlap that independent draws would have by
    chance; all of it when each drew a whole epoch, in whatever order), rather than as a split's; None when there
    are too few to tell (fewer than two ranks with any, or under MIN_EXPECTED_SHARED shared by chance)."""
    filled = {rank: set(items) for rank, items in ranks.items() if items}
    if len(filled) < 2:
        return None
    shared, by_chance = 0, 0.0
    for rank, mine in filled.items():
        others = set().union(*(items for other, items in filled.items() if other != rank))
        shared += len(mine & others)
        # each of mine is among the others' with the chance that they drew it
        by_chance += len(mine) * (min(1.0, len(others) / dataset_len) if dataset_len else 1.0)
    if by_chance < MIN_EXPECTED_SHARED:
        return None
    return shared > DUPLICATE_SHARE * by_chance


def recorded_facts(rec: Recording) -> LoaderFacts | None:
    """A watched rank's loader as its Recording keeps it (what its first epoch drew for `indices` and
    `fingerprints`), for distributed_sampler; None for a Recording that does not say its sampler (saved before
    it did, or made by the probe)."""
    if rec.sampler_distributed is None:
        return None
    return LoaderFacts(
        batch_size=rec.batch_size,
        batches_per_epoch=rec.batches_per_epoch,
        iterable=rec.iterable,
        dataset=rec.dataset,
        dataset_len=rec.dataset_len,
        drop_last=rec.drop_last,
        sampler=rec.sampler,
        distributed=rec.sampler_distributed,
        sampler_drop_last=rec.sampler_drop_last,
        samples_per_epoch=rec.samples_per_epoch,
        indices=rec.drawn_indices,
        fingerprints=list(rec.drawn_fingerprints),
    )


def distributed_sampler(facts: dict[int, LoaderFacts]) -> Finding | None:
    """Under more than one rank: a loader whose ranks do not split the samples (no DistributedSampler on a
    map-style dataset, or a stream not split by rank), or whose ranks take different numbers of steps."""
    world = len(facts)
    if world < 2:
        return None
    first = facts[min(facts)]
    steps = {rank: f.batches_per_epoch for rank, f in facts.items() if f.batches_per_epoch is not None}
    if len(set(steps.values())) > 1:
        return _uneven_steps(steps)
    if first.iterable:
        shared = shared_share({rank: f.fingerprints for rank, f in facts.items()})
        if shared is None or shared <= DUPLICATE_SHARE:
            return None
        return Finding(
            rule="distributed-sampler",
            severity="critical",
            title=f"the {world} ranks read the same stream: {percent(shared)} of each rank's samples came to "
            "another rank too",
            evidence={"world_size": world, "iterable": True, "shared_samples_share": round(shared, 3),
                      "samples_compared": min(len(f.fingerprints) for f in facts.values())},
            fix="The IterableDataset yields the same items in every rank: each epoch trains on one rank's data "
            f"{world} times over. Split the stream by rank (and by worker): torch.distributed.get_rank() and "
            "get_world_size() with torch.utils.data.get_worker_info(), or your library's splitter "
            "(datasets.distributed.split_dataset_by_node, webdataset's split_by_node).",
            snippet=ITERABLE_SNIPPET,
            impact=1.0,  # the ranks train on the same samples: the run's point is lost, as in a hang
        )  # fmt: skip
    if first.distributed:
        return None
    indices = {rank: f.indices or [] for rank, f in facts.items()}
    alike = shared_beyond_chance(indices, first.dataset_len)
    if alike is False:
        return None  # the user's own sampler splits the indices
    if alike is None and first.sampler not in WHOLE_DATASET_SAMPLERS:
        return None  # a sampler of its own, too few indices to tell whether it splits them
    shared = shared_share(indices)
    per_rank = first.samples_per_epoch
    if per_rank is None:
        per_rank = len(first.indices) if first.indices is not None else first.dataset_len
    evidence = {
        "world_size": world,
        "sampler": first.sampler,
        "dataset_len": first.dataset_len,
        "samples_per_rank": per_rank,
        "shared_samples_share": None if shared is None else round(shared, 3),
        "indices_compared": min(len(items) for items in indices.values()),
    }
    every = f"each of the {world} ranks loads all {per_rank} samples" if per_rank else f"the {world} ranks"
    return Finding(
        rule="distributed-sampler",
        severity="critical",
        title=f"no DistributedSampler: {every} of the dataset",
        evidence=evidence,
        fix=f"The loader's {first.sampler} gives every rank the whole dataset: each epoch does {world} times the "
        "loading it needs, and the ranks train on the same samples"
        + (
            ""
            if shared is None or alike is None
            else f" ({percent(shared)} of the indices each rank drew came to "
            "another rank too, where a split leaves none but its padding)"
        )
        + ". Give the DataLoader a DistributedSampler (and call set_epoch(epoch) before each epoch).",
        snippet=MAP_STYLE_SNIPPET,
        impact=1.0,  # the ranks train on the same samples: the run's point is lost, as in a hang
    )


def _uneven_steps(steps: dict[int, int]) -> Finding:
    fewest, most = min(steps.values()), max(steps.values())
    counts = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(steps.items()))
    return Finding(
        rule="distributed-sampler",
        severity="critical",
        title=f"the ranks take different numbers of steps per epoch ({fewest} to {most})",
        evidence={"batches_per_epoch": {str(rank): count for rank, count in sorted(steps.items())}},
        fix=f"Batches per epoch differ between ranks ({counts}). Under DDP every step is a collective: the rank "
        f"with {plural(most - fewest, 'more batch', 'more batches')} waits at the end of the epoch for ranks "
        "that are done (a hang until the collective's timeout), or the extra batches are dropped. Give every "
        "rank as many batches: DistributedSampler pads to equal shares; a stream needs an equal split (or "
        "drop the remainder on every rank).",
        snippet=MAP_STYLE_SNIPPET,
        impact=1.0,
    )


def set_epoch_never_called(rec: Recording) -> Finding | None:
    """A shuffling sampler with set_epoch() (DistributedSampler) that held the same epoch at every iter() of a
    watched run of two epochs or more: set_epoch() was never called, and every epoch drew the same order."""
    held = [e.sampler_epoch for e in rec.epochs if e.sampler_epoch is not None]
    if len(held) < 2 or len(set(held)) > 1:
        return None
    return Finding(
        rule="distributed-sampler",
        severity="warning",
        title=f"set_epoch() was never called: the sampler shuffled the same order in all {len(held)} epochs",
        evidence={"epochs": len(held), "sampler_epoch": held[0]},
        fix=f"The DistributedSampler's epoch stayed {held[0]} at the start of each of {len(held)} epochs: it seeds "
        "the shuffle, so every epoch visited the samples in the same order (and every rank the same part of "
        "it). Call sampler.set_epoch(epoch) before iterating each epoch.",
        snippet=MAP_STYLE_SNIPPET,
        impact=0.0,  # it costs no time, but each epoch repeats the last one's order
    )
