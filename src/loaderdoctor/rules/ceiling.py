"""input-ceiling: what the loop ran at with its input taken away (`run --ceiling`), against its real rate and
against what its waits say the input costs; job-ceiling: the same for a job's ranks together."""

from __future__ import annotations

from loaderdoctor.plain.words import percent
from loaderdoctor.recording.record import Recording
from loaderdoctor.rules.finding import Finding
from loaderdoctor.tap.ceiling import Ceiling

# Points of the loop's time between the measured cost of the input and the wait model's reading past which the
# wait model is called wrong for the job: by every pair of turns, in the same direction (one pair that agrees is
# noise enough, on a shared machine, to leave the reading standing; as verify asks of a fix's pairs).
DISAGREE_BY = 0.10


def disagreement(costs: list[float], overall: float, estimate: float) -> int:
    """+1 when the measured cost is above the waits' reading by more than DISAGREE_BY (overall and in each
    pair's cost), -1 when below, 0 when they agree."""
    for sign in (1, -1):
        if all(sign * (cost - estimate) > DISAGREE_BY for cost in [overall, *costs]):
            return sign
    return 0


def input_ceiling(rec: Recording) -> Finding | None:
    """The measured cost of the input, said first; a warning when the loop's waits tell another story."""
    ceiling = rec.ceiling
    if ceiling is None or ceiling.speedup is None or ceiling.input_cost is None or ceiling.wait_estimate is None:
        return None
    cost, estimate, speedup = ceiling.input_cost, ceiling.wait_estimate, ceiling.speedup
    pairs = ceiling.pair_speedups()
    evidence = {
        "real_batches_per_s": round(ceiling.rate("real") or 0.0, 3),
        "ceiling_batches_per_s": round(ceiling.rate("data-free") or 0.0, 3),
        "ceiling_speedup": round(speedup, 3),
        "measured_input_cost": round(cost, 3),
        "wait_model_input_cost": round(estimate, 3),
        "data_free_steps": ceiling.data_free_steps,
        "turn_speedups": [round(p, 3) for p in pairs],
    }
    unasked = batches_left_unasked(rec)
    if unasked:
        evidence["batches_left_unasked"] = unasked
    if ceiling.kept_length:
        why = f"{ceiling.kept_length}, so each epoch with data-free steps kept its length"
    else:
        why = (
            "where it counts an epoch's batches itself (Lightning's and the Hugging Face Trainer's loops, "
            "range(len(loader))), the data-free steps took the place of as many real ones (the Lightning callback's "
            "ceiling= lengthens the epoch where it can)"
        )
    caveat = f" The loop left {unasked} of its epochs' batches unasked: {why}." if unasked else ""
    measured = (
        f"with its input taken away the loop ran {speedup:.2f}x as fast: the input costs {percent(cost)} of its time"
    )
    direction = disagreement(ceiling.pair_costs(), cost, estimate)
    if not direction:
        return Finding(
            rule="input-ceiling",
            severity="info",
            title=measured[0].upper() + measured[1:] + f" (its waits said {percent(estimate)})",
            evidence=evidence,
            fix=(
                f"A perfect input pipeline would make this job {_faster(speedup)}, and no more: the loop's "
                f"{ceiling.data_free_steps} data-free steps trained on batches it had already seen." + caveat
            ),
            impact=cost,
        )
    if direction > 0:
        why = (
            "loading takes time from the step itself, which the waits do not show: the CPU the step shares with "
            "the workers, or copies of the batch the step makes"
        )
    else:
        why = (
            "part of the time in next() costs nothing: the step's work goes on meanwhile (an asynchronous "
            "device runs the work queued before), so a faster input gains less than the waits say"
        )
    return Finding(
        rule="input-ceiling",
        severity="warning",
        title=f"The loop's waits put the input's cost at {percent(estimate)} of its time, but {measured}",
        evidence=evidence,
        fix=(
            f"Trust the measured figure, {percent(cost)}: the wait model is wrong for this job ({why}). A perfect "
            f"input pipeline would make it {_faster(speedup)}." + caveat
        ),
        impact=cost,
    )


def _faster(speedup: float) -> str:
    """What a perfect input gains, in words: 'no faster' where the data-free turns were no faster than the real."""
    return f"{speedup:.2f}x faster" if speedup > 1.0 else "no faster"


def batches_left_unasked(rec: Recording) -> int:
    """Batches of the loader's epochs that the loop never asked for: it left those epochs (or the run ended) before
    their end. With data-free steps, a loop that counts an epoch's batches leaves as many."""
    per_epoch = rec.batches_per_epoch
    if not per_epoch or rec.ceiling is None or not rec.ceiling.data_free_steps:
        return 0
    return sum(per_epoch - e.batches for e in rec.epochs if e.ended in ("left", "time") and e.batches < per_epoch)


def job_ceiling(ceilings: dict[int, Ceiling]) -> Finding | None:
    """The job's ceiling, from its ranks' data-free turns (one loader made at one place in every rank): the ranks
    meet in collectives, so the job runs at its slowest rank's rate, real or data-free. None with fewer than two
    ranks measured."""
    measured = {rank: c for rank, c in sorted(ceilings.items()) if c.speedup is not None}
    if len(measured) < 2:
        return None
    real = min(c.rate("real") or 0.0 for c in measured.values())
    free = min(c.rate("data-free") or 0.0 for c in measured.values())
    speedup = free / real
    cost = max(0.0, 1.0 - 1.0 / speedup)
    costs = {rank: c.input_cost or 0.0 for rank, c in measured.items()}
    per_rank = ", ".join(f"rank {rank} {percent(c)}" for rank, c in costs.items())
    return Finding(
        rule="job-ceiling",
        severity="info",
        title=(
            f"With its input taken away the job ({len(measured)} ranks) ran {speedup:.2f}x as fast: the input costs "
            f"{percent(cost)} of its time ({per_rank})"
        ),
        evidence={
            "ranks_measured": len(measured),
            "real_batches_per_s": round(real, 3),
            "ceiling_batches_per_s": round(free, 3),
            "ceiling_speedup": round(speedup, 3),
            "measured_input_cost": round(cost, 3),
            "input_cost_by_rank": {str(rank): round(c, 3) for rank, c in costs.items()},
        },
        fix=(
            f"The job runs at its slowest rank's pace, with its input and without: a perfect input pipeline on every "
            f"rank would make it {_faster(speedup)}, and no more."
        ),
        impact=cost,
    )
