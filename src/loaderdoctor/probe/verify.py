"""Verify: the original settings and each fix measured in turns, window beside window for equal time, so that
load that comes and goes on the machine hits them alike; the verdict rests on the spread between the pairs.

Each settings gets one ProbeSession, started once (its start-up measured apart). Then rounds of windows: in
every round each session runs one window of steady running while the others wait, the order reversed every
other round so that a drift favours none. A pair of windows (the original's and a fix's of one round) gives
one speedup; the fix's rate over the original's, both over all their windows, is the speedup reported, and
the pairs' lowest and highest its spread. Every rate is rates.training_rate's: batches per second over whole
epochs, each epoch's start-up included (workers started anew every epoch pay theirs in each), as a training
loop sees them; the one start-up of a run is reported apart. Pairs measured while other processes kept
BUSY_OTHER_CORES or more busy are left out when at least MIN_PAIRS quiet ones remain (and said in the note):
load that comes and goes changes the ratio itself (it slows a process of two threads more than two processes
of one), and the speedup is the machine's as it usually is. When every pair was busy, the speedup is the
machine's under that load, measured fairly (both settings under it, in turns), and the note says it can differ
on a quiet machine (Verification.under_load). A fix is:

- faster when its speedup is at least MIN_SPEEDUP and most pairs agree it is faster;
- slower (not a fix) only when every pair shows it slower, and by as much as MIN_SPEEDUP the other way;
- quicker-start when it is not slower and its workers start far sooner (the start-up every run pays once,
  reported apart from the rate);
- otherwise no-gain, or as-fast when its point is safety or cost, not speed;
- not-measured when fewer than MIN_PAIRS pairs of windows were measured (a run cut short has no ratio),
  other-data when it delivered other samples than the original (an IterableDataset that is not split
  across workers repeats its stream in each one), failed when it stalled or crashed.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.loader.workload import Step
from loaderdoctor.plain.words import plural
from loaderdoctor.probe.budget import deadline_allowance
from loaderdoctor.probe.session import ProbeProgress, ProbeSession
from loaderdoctor.probe.verification import Verification
from loaderdoctor.recording.rates import first_startup_s, training_rate
from loaderdoctor.recording.record import OtherProcess, Recording, Window, steady_batches
from loaderdoctor.recording.usage import BUSY_OTHER_CORES, other_cores
from loaderdoctor.rules.finding import Finding
from loaderdoctor.tap.watchdog import StallPolicy

log = logging.getLogger("loaderdoctor")

# A gain under this is not worth changing settings for, whatever the measuring shows.
MIN_SPEEDUP = 1.10
# Share of the pairs of windows that must show a fix faster for it to count as faster.
AGREEING = 0.75
MIN_PAIRS = 2
ROUNDS = 6  # rounds of windows aimed for within the budget
MIN_WINDOW_S = 1.0  # windows as short as this when the budget allows ROUNDS of them
SHORTEST_WINDOW_S = 0.25  # and down to this to fit MIN_PAIRS rounds into a small budget
MAX_WINDOW_S = 5.0
# A window measures something only with this many steady batches in it.
MIN_WINDOW_BATCHES = 4
# Under other processes' load, pairs whose speedups differ by more than this factor (the highest over the lowest)
# give no one fair figure: the load moved the rates more than the fix did between windows, and the report says
# so, with the range (benchmarks/busy_verdicts.py: audio beside a hog, pairs 3.5x to 8.6x where plain loops in
# turns gave 3.6x to 3.9x).
UNSTEADY_SPREAD = 1.5
# Time a window's warm-up takes on top of its measuring, for planning the rounds.
_WARM_UP_S = 0.3
# A start-up saved, once per run, counts as a gain when it is at least this long (and half of it or more).
MIN_STARTUP_SAVED_S = 1.0
# Fixes whose point is safety, or saving processes and memory, need only not be slower.
SAFETY_RULES = frozenset({"fork-unsafe", "shm-capacity", "fd-limit"})
COST_RULES = frozenset({"cpu-oversubscription"})

VerifyProgress = Callable[[ProbeProgress], None]


def fix_kind(findings: list[Finding]) -> str:
    """What the prescribed change is for: "safety", "cost" (fewer processes or threads), or "speed"."""
    contributors = {f.rule for f in findings if f.severity != "info" and f.settings_change}
    if contributors and contributors <= SAFETY_RULES:
        return "safety"
    if contributors and contributors <= SAFETY_RULES | COST_RULES:
        return "cost"
    return "speed"


def verify(
    spec: LoaderSpec,
    before: Recording,
    findings: list[Finding],
    candidates: list[Settings],
    *,
    budget_s: float,
    step: Step | None,
    policy: StallPolicy | None = None,
    progress: VerifyProgress | None = None,
    clock: Callable[[], float] = time.perf_counter,
    lock_free: bool = False,
) -> list[Verification]:
    """Measure each candidate settings against the original ones (those of `before`) in turns, within about
    `budget_s` seconds; one Verification per candidate, in order. With `lock_free`, the candidates' workers
    make their file-lock calls on read-only files no-ops (the original's as they are): a lock's cost measured,
    judged as a gain in speed whatever the findings."""
    kind = "speed" if lock_free else fix_kind(findings)
    policy = policy or StallPolicy()
    if before.outcome != "completed":
        share = budget_s / max(1, len(candidates))
        return [_alone(spec, before, c, share, step, policy, progress, clock, lock_free) for c in candidates]
    deadline = clock() + budget_s
    sessions: list[ProbeSession | None] = []
    errors: list[str | None] = []
    try:
        for number, settings in enumerate([before.settings, *candidates]):
            startup_limit = deadline_allowance(max(1.0, (deadline - clock()) / 4))
            session, error = _started(
                spec, settings, step, policy, progress, clock, startup_limit, lock_free=lock_free and number > 0
            )
            sessions.append(session)
            errors.append(error)
        _take_turns([s for s in sessions if s is not None and s.ran], deadline, clock)
    finally:
        recordings = [None if s is None else s.close() for s in sessions]
    original = recordings[0]
    results = []
    for settings, recording, error in zip(candidates, recordings[1:], errors[1:], strict=True):
        if original is None or recording is None:
            why = errors[0] if original is None else error
            results.append(_not_measured(settings, before, f"not measured: {why}"))
        else:
            results.append(compare(original, recording, kind))
    return results


def _started(
    spec: LoaderSpec,
    settings: Settings,
    step: Step | None,
    policy: StallPolicy,
    progress: VerifyProgress | None,
    clock: Callable[[], float],
    startup_limit_s: float,
    *,
    lock_free: bool = False,
) -> tuple[ProbeSession | None, str | None]:
    """A session of `settings` past its start-up, or None and why it could not be made."""
    try:
        session = ProbeSession(
            spec, settings, step=step, policy=policy, progress=progress, clock=clock, lock_free=lock_free
        )
    except LoaderDoctorError as error:
        log.info("settings %s could not be measured: %s", settings, error)
        return None, error.message
    try:
        session.start(startup_limit_s=startup_limit_s)
    except BaseException:
        session.close()
        raise
    return session, None


def _take_turns(sessions: list[ProbeSession], deadline: float, clock: Callable[[], float]) -> None:
    """Rounds of one window per session, the order reversed every other round, until the time is spent."""
    if not sessions:
        return
    per_round = len(sessions)
    remaining = deadline - clock()
    window_s = remaining / (per_round * ROUNDS) - _WARM_UP_S
    if window_s < MIN_WINDOW_S:  # fewer, shorter rounds: but MIN_PAIRS of them
        window_s = min(MIN_WINDOW_S, remaining / (per_round * MIN_PAIRS) - _WARM_UP_S)
    window_s = min(MAX_WINDOW_S, max(SHORTEST_WINDOW_S, window_s))
    for number in range(10**6):
        if clock() + per_round * (window_s + _WARM_UP_S) > deadline and number >= 1:
            return
        if not sessions[0].ran:
            return  # the original settings stalled or crashed: nothing left to compare with
        # A fix that stalled or crashed has its verdict; the others go on, window i beside window i.
        running = [s for s in sessions if s.ran]
        order = running if number % 2 == 0 else list(reversed(running))
        for session in order:
            session.run(window_s, warm_up=True, min_batches=MIN_WINDOW_BATCHES)
            if session.iterator is not None and session.settings.backend == "thread":
                # The threads of a paused session would be alive when another session forks its workers.
                session.end_epoch("time")


def _alone(
    spec: LoaderSpec,
    before: Recording,
    settings: Settings,
    budget_s: float,
    step: Step | None,
    policy: StallPolicy,
    progress: VerifyProgress | None,
    clock: Callable[[], float],
    lock_free: bool,
) -> Verification:
    """A fix for settings that stalled or crashed: measured on its own (there is no rate to compare with)."""
    session, error = _started(
        spec, settings, step, policy, progress, clock, deadline_allowance(budget_s), lock_free=lock_free
    )
    if session is None:
        return _not_measured(settings, before, f"not measured: {error}")
    try:
        session.run(budget_s)
    finally:
        after = session.close()
    rate = training_rate(after) or 0.0
    if after.outcome != "completed":
        verdict, note = "failed", f"the prescribed settings {after.outcome} too"
    elif after.batches:
        verdict = "rescued"
        note = f"delivered {len(after.batches)} batches where the original settings {before.outcome}"
    else:
        verdict, note = "not-measured", "not measured: no batch came within the budget"
    return Verification(
        settings,
        0.0,
        rate,
        before.outcome,
        after.outcome,
        verdict,
        note,
        after,
        after_startup_s=first_startup_s(after),
        other_processes=after.other_processes,
    )


def _not_measured(settings: Settings, before: Recording, note: str) -> Verification:
    return Verification(settings, 0.0, 0.0, before.outcome, "failed", "not-measured", note)


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
    verdict = decide(speedup, ratios, kind)
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
    under_load = all(p.other_cores >= BUSY_OTHER_CORES for p in used)
    unsteady = under_load and spread[1] > UNSTEADY_SPREAD * spread[0]
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
    return Verification(
        settings, rate_before, rate_after, before.outcome, after.outcome, verdict, note,
        spread=spread, pairs=len(ratios), busy_pairs=len(busy), under_load=under_load, unsteady=unsteady,
        **common,
    )  # fmt: skip


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
