"""Rules about the samples themselves: those that raise while loading, and those that come more than once."""

from __future__ import annotations

from collections import Counter

from loaderdoctor.plain.words import percent
from loaderdoctor.recording.record import Recording
from loaderdoctor.rules.finding import Finding

SHOWN_INDICES = 20
# Workers repeat one stream when at least this share of the samples seen are copies of others (with 2 workers
# each reading the whole stream, half of them are).
REPEATED_SHARE = 0.25
MESSAGE_CHARS = 200


def _subset_snippet(bad: list[int]) -> str:
    listed = ", ".join(map(str, bad))
    return (
        "from torch.utils.data import Subset\n"
        "\n"
        f"bad = {{{listed}}}  # the samples that raised in loaderdoctor's run; others may too\n"
        "dataset = Subset(dataset, [i for i in range(len(dataset)) if i not in bad])"
    )


def sample_errors(rec: Recording) -> Finding | None:
    """Samples raised in __getitem__: how many, which, and how to leave them out."""
    errors = rec.sample_errors
    if not errors:
        return None
    # The samples seen are those delivered plus those that raised instead.
    seen = sum(b.samples for b in rec.batches) + len(errors)
    fraction = len(errors) / seen
    indices = sorted({e.index for e in errors if e.index is not None})
    types = Counter(e.error_type for e in errors)
    first = errors[0]
    noun = "sample" if len(errors) == 1 else "samples"
    return Finding(
        rule="sample-errors",
        severity="critical",
        title=f"{len(errors)} {noun} raised an error while loading ({percent(fraction)} of the samples seen)",
        evidence={
            "count": len(errors),
            "fraction": round(fraction, 4),
            "indices": indices[:SHOWN_INDICES],
            "error_types": dict(types.most_common()),
            "first_message": f"{first.error_type}: {first.message}"[:MESSAGE_CHARS],
        },
        fix=(
            "In a training loop the first of these raises and ends the run (with workers the whole batch is "
            "lost): repair these samples, or leave them out of the dataset."
        ),
        snippet=_subset_snippet(indices) if indices else None,
        settings_change={},
        impact=1.0,
    )


SPLIT_STREAM_SNIPPET = """\
import itertools
from torch.utils.data import IterableDataset, get_worker_info

class MyStream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        if info is None:  # no workers: the main process reads everything
            return iter(self.read_all())
        # each worker reads its own share: shards by worker id (or every num_workers-th item of one stream)
        shards = self.shards[info.id :: info.num_workers]
        return itertools.chain.from_iterable(self.read(shard) for shard in shards)"""


def duplicate_samples(rec: Recording) -> Finding | None:
    """The workers of an IterableDataset deliver the same samples: the stream is not split across them, so
    each one reads all of it and every sample comes once per worker."""
    workers = rec.settings.num_workers
    if not rec.iterable or workers < 2:
        return None
    tallied = [e for e in rec.epochs if e.samples_fingerprinted and e.typical_copies is not None]
    seen = sum(e.samples_fingerprinted for e in tallied)
    distinct = sum(e.distinct_samples or 0 for e in tallied)
    copies = max((e.typical_copies or 1 for e in tallied), default=1)
    repeated = copies == workers and seen > 0 and distinct <= seen * (1 - REPEATED_SHARE)
    expected = rec.batches_per_epoch
    exhausted = [e.batches for e in rec.epochs if e.ended == "exhausted"]
    too_long = expected is not None and any(n >= workers * expected for n in exhausted)
    if not (repeated or too_long):
        return None
    evidence: dict[str, object] = {"num_workers": workers, "samples_seen": seen, "distinct_samples": distinct}
    if repeated:
        evidence["copies_of_each_sample"] = copies
    if exhausted:
        evidence["epoch_batches"] = max(exhausted)
        evidence["expected_batches"] = expected
    title = (
        f"Each of the {workers} workers delivers the same samples: every sample comes {copies} times an epoch"
        if repeated
        else f"An epoch held {max(exhausted)} batches where the loader's length is {expected}: each worker repeats it"
    )
    return Finding(
        rule="duplicate-samples",
        severity="critical",
        title=title,
        evidence=evidence,
        fix=(
            "The IterableDataset does not split its stream across workers, so each worker reads all of it: "
            "training sees every sample once per worker, and the loader's rate counts the copies. In __iter__, "
            "give each worker its share by torch.utils.data.get_worker_info() (id and num_workers)."
        ),
        snippet=SPLIT_STREAM_SNIPPET,
        settings_change={},
        impact=1.0,
    )
