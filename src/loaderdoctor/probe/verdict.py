"""The verdict on a fix from the windows measured in turns (probe/verify.py runs them): its speedup over the
original settings from the pairs of windows, the spread between the pairs, and the words the reports give it. See
verify.py's docstring for what each verdict means."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from loaderdoctor.plain.words import plural
from loaderdoctor.probe.verification import Verification
from loaderdoctor.recording.rates import first_startup_s, training_rate
from loaderdoctor.recording.record import OtherProcess, Recording, Window, steady_batches
from loaderdoctor.recording.threads import busy_threads_per_worker
from loaderdoctor.recording.usage import BUSY_OTHER_CORES, other_cores

# A gain under this is not worth changing settings for, whatever the measuring shows.
MIN_SPEEDUP = 1.10
# Share of the pairs of windows that must show a fix faster for it to count as faster.
AGREEING = 0.75
MIN_PAIRS = 2
# A window measures something only with this many steady batches in it.
MIN_WINDOW_BATCHES = 4
# Under other processes' load, pairs whose speedups differ by more than this factor (the highest over the lowest)
# give no one fair figure: the load moved the rates more than the fix did between windows, and the report says
# so, with the range (benchmarks/busy_verdicts.py: audio beside a hog, pairs 3.5x to 8.6x where plain loops in
# turns gave 3.6x to 3.9x).
UNSTEADY_SPREAD = 1.5
# A start-up saved, once per run, counts as a gain when it is at least this long (and half of it or more).
MIN_STARTUP_SAVED_S = 1.0


def _window_rate(rec: Recording, window: Window) -> float | None:
    if len(steady_batches(rec, window)) < MIN_WINDOW_BATCHES:
        return None
    return training_rate(rec, window)


def _other_data(before: Recording, after: Recording) -> str | None:
    """How the fix's samples differ from the original's, or None when nothing shows they do."""
    copies_before = max((e.typical_copies or 1 for e in before.epochs if e.typical_copies), default=1)
    copies_after = max((e.typical_copies or 1 for e in after.epochs if e.typical_copies), default=1)
    if copies_after > copies_before:
        workers = after.settings.num_workers
        return (
            f"with {plural(workers, 'worker')} every sample came {copies_after} times: the IterableDataset does not "
            "split its stream across workers (torch.utils.data.get_worker_info()), so each one repeats it"
        )
    lengths_before = {e.batches for e in before.epochs if e.ended == "exhausted"}
    lengths_after = {e.batches for e in after.epochs if e.ended == "exhausted"}
    if lengths_before and lengths_after and lengths_before != lengths_after:
        return (
            f"an epoch held {max(lengths_after)} batches where the original's held {max(lengths_before)}: the "
            "dataset yields other data with these settings"
        )
    return None


def compare(before: Recording, after: Recording, kind: str) -> Verification:
    """The verdict on `after` (a fix) against `before` (the original settings), measured in windows of the same
    rounds (window i of one beside window i of the other)."""
    others = [c for rec in (before, after) for w in rec.windows if (c := other_cores(rec, w)) is not None]
    common = {
        "after_recording": after,
        "before_startup_s": first_startup_s(before),
        "after_startup_s": first_startup_s(after),
        "other_cores": max(others) if others else None,
        "other_processes": _busiest(before, after),
    }
    rate_before = training_rate(before) or 0.0
    rate_after = training_rate(after) or 0.0
    settings = after.settings
    if before.outcome != "completed" and after.outcome == "completed":
        note = (
            f"the original settings {before.outcome} while they were measured again; these delivered "
            f"{len(after.batches)} batches"
        )
        return Verification(settings, 0.0, rate_after, before.outcome, after.outcome, "rescued", note, **common)
    if after.outcome != "completed":
        note = f"the prescribed settings {after.outcome}" + (f": {after.error}" if after.error else "")
        return Verification(settings, rate_before, 0.0, before.outcome, after.outcome, "failed", note, **common)
    different = _other_data(before, after)
    if different is not None:
        return Verification(
            settings, rate_before, rate_after, before.outcome, "other-data", "other-data",
            f"not compared: {different}", **common,
        )  # fmt: skip
    pairs = _pairs(before, after)
    quiet = [p for p in pairs if p.other_cores < BUSY_OTHER_CORES]
    # Too few quiet pairs (a machine busy throughout): the machine as it was is all there is.
    busy = [p for p in pairs if p.other_cores >= BUSY_OTHER_CORES] if len(quiet) >= MIN_PAIRS else []
    used = quiet if busy else pairs
    if busy:  # the quiet pairs alone: the machine as it usually is
        rate_before = statistics.mean(p.before for p in used)
        rate_after = statistics.mean(p.after for p in used)
    ratios = [p.after / p.before for p in used]
    if len(ratios) < MIN_PAIRS or rate_before <= 0:
        return Verification(
            settings, rate_before, rate_after, before.outcome, "cut-short", "not-measured",
            f"not measured: only {plural(len(ratios), 'pair')} of windows had {MIN_WINDOW_BATCHES} or more batches "
            "each within the budget: give a larger --budget", pairs=len(ratios), **common,
        )  # fmt: skip
    speedup = rate_after / rate_before
    spread = (min(ratios), max(ratios))
    under_load = all(p.other_cores >= BUSY_OTHER_CORES for p in used)
    unsteady = under_load and spread[1] > UNSTEADY_SPREAD * spread[0]
    verdict = decide(speedup, ratios, kind)
    # "As fast" is a gain only where the fix saves what it is for (processes or threads), and only where the pairs
    # could show it: pairs too unsteady for one figure show no clear difference, which verifies nothing.
    if verdict == "as-fast" and (unsteady or (kind == "cost" and not _runs_fewer(before, after))):
        verdict = "no-gain"
    startups = first_startup_s(before), first_startup_s(after)
    if verdict in ("no-gain", "as-fast") and _starts_sooner(*startups):
        verdict = "quicker-start"
    note = _note(verdict, speedup, spread, len(ratios), kind)
    if busy:
        taken = max(p.other_cores for p in busy)
        note += (
            f"; {plural(len(busy), 'more pair')} measured while other processes took up to {taken:.1f} cores "
            f"({_x_range(busy)}) left out"
        )
    if under_load:
        low, high = min(p.other_cores for p in used), max(p.other_cores for p in used)
        taken = f"{low:.1f}" if round(low, 1) == round(high, 1) else f"{low:.1f} to {high:.1f}"
        if unsteady:
            note = _unsteady_note(verdict, spread, len(ratios), taken)
        else:
            note += (
                f"; every pair was measured while other processes took {taken} cores: a fair comparison under "
                "that load (both settings in turns), which can differ from a quiet machine's"
            )
    if verdict == "quicker-start":
        note = f"starts in {startups[1]:.2f} s instead of {startups[0]:.2f} s, once per run, and runs as fast ({note})"
    elif verdict == "slower" and _starts_sooner(*startups):  # both, for the user to weigh for a run's length
        note = f"starts in {startups[1]:.2f} s instead of {startups[0]:.2f} s, once per run, but then runs {note}"
    return Verification(
        settings, rate_before, rate_after, before.outcome, after.outcome, verdict, note,
        spread=spread, pairs=len(ratios), busy_pairs=len(busy), under_load=under_load, unsteady=unsteady,
        **common,
    )  # fmt: skip


def _runs_fewer(before: Recording, after: Recording) -> bool:
    """Whether the fix ran fewer worker processes, or fewer threads busy in them, than the original settings."""
    if after.settings.num_workers < before.settings.num_workers:
        return True
    busy_before, busy_after = busy_threads_per_worker(before), busy_threads_per_worker(after)
    return busy_before is not None and busy_after is not None and busy_after < busy_before


def _unsteady_note(verdict: str, spread: tuple[float, float], pairs: int, taken: str) -> str:
    """The note for pairs that differ too much under load for one figure: the direction, and the range."""
    measured = f"{pairs} pairs of windows, {spread[0]:.2f}x to {spread[1]:.2f}x"
    direction = {"faster": "faster", "slower": "slower"}.get(verdict, "no clear difference")
    return (
        f"{direction} ({measured}), but by how much could not be measured fairly: other processes took {taken} "
        "cores throughout, and moved the rates between windows more than one figure allows; check again on a "
        "quieter machine for one"
    )


@dataclass(frozen=True)
class _Pair:
    """Window i of the original settings and window i of a fix: their rates and the cores that other
    processes took meanwhile (the more of the two windows)."""

    before: float
    after: float
    other_cores: float


def _pairs(before: Recording, after: Recording) -> list[_Pair]:
    """The pairs of windows in which both settings delivered enough steady batches to have a rate."""
    pairs = []
    for window_before, window_after in zip(before.windows, after.windows, strict=False):
        rates = _window_rate(before, window_before), _window_rate(after, window_after)
        if rates[0] and rates[1] is not None:
            others = [other_cores(before, window_before), other_cores(after, window_after)]
            pairs.append(_Pair(rates[0], rates[1], max((c for c in others if c is not None), default=0.0)))
    return pairs


def _x_range(pairs: list[_Pair]) -> str:
    ratios = [p.after / p.before for p in pairs]
    return f"{min(ratios):.2f}x" if len(ratios) == 1 else f"{min(ratios):.2f}x to {max(ratios):.2f}x"


def _starts_sooner(before_s: float | None, after_s: float | None) -> bool:
    """Whether the fix's workers start far sooner: in half the time or less, and a second or more sooner."""
    if before_s is None or after_s is None:
        return False
    return after_s <= before_s / 2 and before_s - after_s >= MIN_STARTUP_SAVED_S


def decide(speedup: float, ratios: list[float], kind: str) -> str:
    """The verdict from the pooled speedup and the pairs' speedups (see the module's docstring)."""
    faster = sum(r > 1.0 for r in ratios) / len(ratios)
    if speedup >= MIN_SPEEDUP and faster >= AGREEING:
        return "faster"
    if speedup <= 1 / MIN_SPEEDUP and max(ratios) < 1.0:
        return "slower"
    return "as-fast" if kind in ("safety", "cost") else "no-gain"


def _note(verdict: str, speedup: float, spread: tuple[float, float], pairs: int, kind: str) -> str:
    measured = f"{pairs} pairs of windows, {spread[0]:.2f}x to {spread[1]:.2f}x"
    if verdict == "faster":
        return f"{speedup:.2f}x faster ({measured}), measured in turns with the same training step"
    if verdict == "slower":
        return f"slower in every pair of windows ({speedup:.2f}x; {measured}): not a fix for this loader"
    if verdict == "as-fast":
        gain = "without the hazard" if kind == "safety" else "with fewer processes or threads"
        return f"as fast ({speedup:.2f}x; {measured}) {gain}"
    if verdict == "quicker-start":
        return f"{speedup:.2f}x; {measured}"
    return (
        f"no measurable gain ({speedup:.2f}x; {measured}): not faster beyond the spread between windows, so "
        "your settings stay"
    )


def _busiest(before: Recording, after: Recording) -> list[OtherProcess]:
    """The other processes that took CPU during either run, busiest first, each named once."""
    seen: dict[int, OtherProcess] = {}
    for process in sorted(before.other_processes + after.other_processes, key=lambda p: -p.cores):
        seen.setdefault(process.pid, process)
    return list(seen.values())
