"""GuardedLoader's options checked and turned into what it runs with."""

from __future__ import annotations

import dataclasses

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.samples import ON_SAMPLE_ERROR
from loaderdoctor.tap.watchdog import StallPolicy


def stall_policy(stall_timeout: float | StallPolicy | None, *, users_timeout_s: float = 0.0) -> StallPolicy:
    """The watchdog's policy: adaptive defaults (None), one number for both deadlines, or a policy as is.

    With the user's own DataLoader(timeout=...) (`users_timeout_s` > 0) torch raises its error when a batch takes
    longer, as the plain DataLoader does: the watchdog's deadlines are moved past it (twice it, and 5 s more),
    so that it acts only where torch's timeout cannot (a hang outside the wait torch times)."""
    if stall_timeout is None:
        policy = StallPolicy()
    elif isinstance(stall_timeout, StallPolicy):
        policy = stall_timeout
    elif isinstance(stall_timeout, bool) or not isinstance(stall_timeout, int | float) or not stall_timeout > 0:
        raise UsageError(
            f"stall_timeout must be a number of seconds above 0, a StallPolicy or None, not {stall_timeout!r}"
        )
    else:
        policy = StallPolicy(floor_s=float(stall_timeout), first_batch_s=float(stall_timeout))
    if users_timeout_s > 0:
        later = 2 * users_timeout_s + 5.0
        policy = dataclasses.replace(
            policy, floor_s=max(policy.floor_s, later), first_batch_s=max(policy.first_batch_s, later)
        )
    return policy


def check_sample_options(on_sample_error: str, max_bad_fraction: float, *, iterable: bool = False) -> None:
    """A UsageError unless on_sample_error is a known choice (and one that has a meaning for the dataset: "skip"
    replaces a sample by index, which an `iterable` dataset has not) and max_bad_fraction a fraction."""
    if on_sample_error not in ON_SAMPLE_ERROR:
        raise UsageError(
            f"on_sample_error must be one of {', '.join(map(repr, ON_SAMPLE_ERROR))}, not {on_sample_error!r}"
        )
    if iterable and on_sample_error == "skip":
        raise UsageError(
            "on_sample_error='skip' replaces a sample that raises by the next dataset index that loads, and an "
            "IterableDataset has no indices",
            hint="use on_sample_error='raise' (the default), and skip bad samples inside the dataset's own iterator",
        )
    number = isinstance(max_bad_fraction, int | float) and not isinstance(max_bad_fraction, bool)
    if not number or not 0 <= max_bad_fraction <= 1:
        raise UsageError(f"max_bad_fraction must be a number from 0 to 1, not {max_bad_fraction!r}")
