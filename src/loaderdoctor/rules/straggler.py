"""rank-straggler: in a distributed run, some ranks wait on their data far longer than the others, while the
others, whose data is ready, wait for them in the collective (their step takes about that much longer). Judged on
every rank's Recording of one loader; names the slow ranks and their hosts (the node whose storage or load is
slow, when they share one), their wait, the share of the others' step spent waiting for them, and the slowest
rank's settings and own findings."""

from __future__ import annotations

import statistics

from loaderdoctor.plain.words import percent
from loaderdoctor.recording.record import Recording, steady_batches
from loaderdoctor.rules.finding import CRITICAL_TIME_SHARE, WARNING_TIME_SHARE, Finding

# A rank is slow when it waits on data at least STRAGGLER_RATIO times the median wait of the ranks that are not,
# and at least STRAGGLER_MIN_S more per batch (a few ms against a few ms is no straggler); they straggle when the
# others wait for them: the others' step is longer than the slowest one's by at least HELD_SHARE of its extra
# wait (the collective holds them).
STRAGGLER_RATIO = 3.0
STRAGGLER_MIN_S = 0.020
HELD_SHARE = 0.5


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def slow_ranks(waits: dict[int, float]) -> list[int]:
    """The ranks whose wait is at least STRAGGLER_RATIO times the median wait of the other ranks, the ones not
    slow, and STRAGGLER_MIN_S more, in rank order. Found from the fastest half of the ranks up, then again from
    the median of those not found slow until nothing changes: slow ranks never raise the median they are judged
    by (two slow ranks of four, say)."""
    fastest = sorted(waits, key=lambda rank: waits[rank])[: (len(waits) + 1) // 2]
    typical = statistics.median(waits[rank] for rank in fastest)
    slow: list[int] = []
    for _ in range(len(waits)):
        found = [
            rank for rank, wait in sorted(waits.items())
            if wait >= STRAGGLER_RATIO * typical and wait - typical >= STRAGGLER_MIN_S
        ]  # fmt: skip
        if found == slow or len(found) == len(waits):
            break
        slow = found
        typical = statistics.median(wait for rank, wait in waits.items() if rank not in slow)
    return slow if len(slow) < len(waits) else []


def rank_straggler(
    ranks: dict[int, Recording],
    hosts: dict[int, str] | None = None,
    rank_findings: dict[int, list[Finding]] | None = None,
) -> Finding | None:
    """The finding on the ranks that wait on data well above the others and hold them (see STRAGGLER_RATIO),
    when there are any; `hosts` names their hosts, and `rank_findings` (check's rules on each rank's Recording)
    the slowest one's causes. Its evidence's `rank` is the slowest of them, `ranks` all of them."""
    waits: dict[int, float] = {}
    steps: dict[int, float] = {}
    for rank, rec in ranks.items():
        steady = steady_batches(rec)
        wait, step = _mean([b.wait_s for b in steady]), _mean([b.step_s for b in steady])
        if wait is not None and step is not None:
            waits[rank], steps[rank] = wait, step
    if len(waits) < 2:
        return None
    slow = slow_ranks(waits)
    if not slow:
        return None
    slowest = max(slow, key=lambda rank: waits[rank])
    others = [rank for rank in waits if rank not in slow]
    typical_wait = statistics.median(waits[rank] for rank in others)
    extra = waits[slowest] - typical_wait
    others_step = statistics.median(steps[rank] for rank in others)
    in_collective = others_step - steps[slowest]  # the others' step holds the wait for the straggler's batch
    if in_collective < HELD_SHARE * extra:
        return None  # the others do not wait for it: no collective ties the ranks' steps (or it is not the data)
    interval = others_step + typical_wait
    share = extra / interval if interval > 0 else 1.0
    if share < WARNING_TIME_SHARE:
        return None
    known = hosts or {}
    slow_hosts = list(dict.fromkeys(host for rank in slow if (host := known.get(rank))))
    host = known.get(slowest)
    own = [f for f in (rank_findings or {}).get(slowest, []) if f.rule != "input-bound"]
    held = in_collective / others_step if others_step > 0 else 1.0
    settings = ranks[slowest].settings
    return Finding(
        rule="rank-straggler",
        severity="critical" if share >= CRITICAL_TIME_SHARE else "warning",
        title=_title(slow, slow_hosts, [waits[rank] for rank in slow], in_collective, others_step, held),
        evidence={
            "rank": slowest,
            "host": host,
            "ranks": slow,
            "hosts": slow_hosts,
            "wait_ms": round(waits[slowest] * 1000, 2),
            "others_median_wait_ms": round(typical_wait * 1000, 2),
            "step_ms": round(steps[slowest] * 1000, 2),
            "others_median_step_ms": round(others_step * 1000, 2),
            "wait_ms_by_rank": {str(rank): round(wait * 1000, 2) for rank, wait in sorted(waits.items())},
            "share_of_interval": round(share, 3),
            "share_of_others_step": round(held, 3),
            "settings": settings.describe(),
            "rank_findings": [f.rule for f in own],
        },
        fix=_fix(slow, slow_hosts, own, share),
        snippet=own[0].snippet if own else None,
        settings_change=own[0].settings_change if own else {},
        impact=share,
    )


def _ranks(ranks: list[int], hosts: list[str]) -> str:
    """ "rank 1 on node-b", "ranks 2, 3 on node1": the ranks and where they run, as far as known."""
    words = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return words + (f" on {', '.join(hosts)}" if hosts else "")


def _title(ranks: list[int], hosts: list[str], waits: list[float], held_s: float, step_s: float, held: float) -> str:
    low, high = round(min(waits) * 1000), round(max(waits) * 1000)
    wait = f"{high} ms" if low == high else f"{low}-{high} ms"
    one = len(ranks) == 1
    return (
        f"{_ranks(ranks, hosts)} {'waits' if one else 'wait'} {wait} per batch for data; the other ranks wait "
        f"for {'it' if one else 'them'} ({held_s * 1000:.0f} ms of their {step_s * 1000:.0f} ms step, "
        f"{percent(held)})"
    )


def _fix(ranks: list[int], hosts: list[str], own: list[Finding], share: float) -> str:
    where = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    where += f" (on {', '.join(hosts)})" if hosts else ""
    if len(ranks) == 1:
        text = f"Every step waits for the slowest rank: {where} costs every rank {percent(share)} of a step. "
        text += "Make its loading as fast as the others': "
        causes = "its storage, its host's load or its share of the data differ from the others' (compare them); "
        causes += "more workers on that rank overlap slow reads."
        shows = "its own loader shows"
    else:
        text = f"Every step waits for the slowest rank: {where} cost every rank {percent(share)} of a step. "
        text += "Make their loading as fast as the others': "
        causes = "their storage, their hosts' load or their share of the data differ from the others' (compare "
        causes += "them); more workers on those ranks overlap slow reads."
        shows = "the slowest one's own loader shows"
    return text + (f"{shows} {own[0].rule}: {own[0].fix}" if own else causes)
