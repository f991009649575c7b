"""rank-straggler: in a distributed run, one rank waits on its data far longer than the median rank while the
others, whose data is ready, wait for it in the collective (their step takes about that much longer). Judged on
every rank's Recording of one loader; names the rank, its host, its wait, its settings and its own findings."""

from __future__ import annotations

import statistics

from loaderdoctor.plain.words import percent
from loaderdoctor.recording.record import Recording, steady_batches
from loaderdoctor.rules.finding import CRITICAL_TIME_SHARE, WARNING_TIME_SHARE, Finding

# A rank is a straggler when it waits on data at least STRAGGLER_RATIO times the median of the other ranks'
# wait, at least STRAGGLER_MIN_S more per batch (a few ms against a few ms is no straggler), and the others
# wait for it: their step is longer than its own by at least half of that (the collective holds them).
STRAGGLER_RATIO = 3.0
STRAGGLER_MIN_S = 0.020
HELD_SHARE = 0.5


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def rank_straggler(
    ranks: dict[int, Recording],
    hosts: dict[int, str] | None = None,
    rank_findings: dict[int, list[Finding]] | None = None,
) -> Finding | None:
    """The finding on the rank that waits on data well above the others (see STRAGGLER_RATIO), when there is
    one; `hosts` and `rank_findings` (check's rules on each rank's Recording) name its host and its causes."""
    waits: dict[int, float] = {}
    steps: dict[int, float] = {}
    for rank, rec in ranks.items():
        steady = steady_batches(rec)
        wait, step = _mean([b.wait_s for b in steady]), _mean([b.step_s for b in steady])
        if wait is not None and step is not None:
            waits[rank], steps[rank] = wait, step
    if len(waits) < 2:
        return None
    slow = max(waits, key=lambda rank: waits[rank])
    others = [rank for rank in waits if rank != slow]
    typical_wait = statistics.median(waits[rank] for rank in others)
    extra = waits[slow] - typical_wait
    if waits[slow] < STRAGGLER_RATIO * typical_wait or extra < STRAGGLER_MIN_S:
        return None
    others_step = statistics.median(steps[rank] for rank in others)
    in_collective = others_step - steps[slow]  # the others' step holds the wait for the straggler's batch
    if in_collective < HELD_SHARE * extra:
        return None  # the others do not wait for it: no collective ties the ranks' steps (or it is not the data)
    interval = others_step + typical_wait
    share = extra / interval if interval > 0 else 1.0
    if share < WARNING_TIME_SHARE:
        return None
    host = (hosts or {}).get(slow)
    own = [f for f in (rank_findings or {}).get(slow, []) if f.rule != "input-bound"]
    title = f"rank {slow} waits {waits[slow] * 1000:.0f} ms per batch for data"
    title += f" on {host}" if host else ""
    title += f"; the others wait for rank {slow}"
    title += f" (their step takes {in_collective * 1000:.0f} ms longer than rank {slow}'s)"
    settings = ranks[slow].settings
    return Finding(
        rule="rank-straggler",
        severity="critical" if share >= CRITICAL_TIME_SHARE else "warning",
        title=title,
        evidence={
            "rank": slow,
            "host": host,
            "wait_ms": round(waits[slow] * 1000, 2),
            "others_median_wait_ms": round(typical_wait * 1000, 2),
            "step_ms": round(steps[slow] * 1000, 2),
            "others_median_step_ms": round(others_step * 1000, 2),
            "wait_ms_by_rank": {str(rank): round(wait * 1000, 2) for rank, wait in sorted(waits.items())},
            "share_of_interval": round(share, 3),
            "settings": settings.describe(),
            "rank_findings": [f.rule for f in own],
        },
        fix=_fix(slow, host, own, share),
        snippet=own[0].snippet if own else None,
        settings_change=own[0].settings_change if own else {},
        impact=share,
    )


def _fix(rank: int, host: str | None, own: list[Finding], share: float) -> str:
    where = f"rank {rank}" + (f" (on {host})" if host else "")
    text = (
        f"Every step waits for the slowest rank: {where} costs every rank {percent(share)} of a step. "
        "Make its loading as fast as the others': "
    )
    if own:
        return text + f"its own loader shows {own[0].rule}: {own[0].fix}"
    return text + (
        "its storage, its host's load or its share of the data differ from the others' (compare them); "
        "more workers on that rank overlap slow reads."
    )
