"""Rules about the samples themselves: those that raise while loading."""

from __future__ import annotations

from collections import Counter

from loaderdoctor.recording import Recording
from loaderdoctor.report import Finding
from loaderdoctor.rules._common import percent

SHOWN_INDICES = 20
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
