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
from collections.abc import Callable

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.loader.settings import Settings
from loaderdoctor.probe.budget import deadline_allowance
from loaderdoctor.probe.datafree import DataFreeWindows
from loaderdoctor.probe.measuring import Measuring
from loaderdoctor.probe.session import ProbeSession
from loaderdoctor.probe.verdict import MIN_PAIRS, MIN_WINDOW_BATCHES, compare
from loaderdoctor.probe.verification import Verification
from loaderdoctor.recording.rates import first_startup_s, training_rate
from loaderdoctor.recording.record import Recording
from loaderdoctor.rules.finding import Finding

log = logging.getLogger("loaderdoctor")

ROUNDS = 6  # rounds of windows aimed for within the budget
MIN_WINDOW_S = 1.0  # windows as short as this when the budget allows ROUNDS of them
SHORTEST_WINDOW_S = 0.25  # and down to this to fit MIN_PAIRS rounds into a small budget
MAX_WINDOW_S = 5.0
# Time a window's warm-up takes on top of its measuring, for planning the rounds.
_WARM_UP_S = 0.3
DATA_FREE_SHARE = 0.5  # a data-free window (the loop's ceiling, probe/datafree.py) against a session's window
# Fixes whose point is safety, or saving processes and memory, need only not be slower.
SAFETY_RULES = frozenset({"fork-unsafe", "shm-capacity", "fd-limit"})
COST_RULES = frozenset({"cpu-oversubscription"})


def fix_kind(findings: list[Finding]) -> str:
    """What the prescribed change is for: "safety", "cost" (fewer processes or threads), or "speed"."""
    contributors = {f.rule for f in findings if f.severity != "info" and f.settings_change}
    if contributors and contributors <= SAFETY_RULES:
        return "safety"
    if contributors and contributors <= SAFETY_RULES | COST_RULES:
        return "cost"
    return "speed"


def verify(
    measuring: Measuring,
    before: Recording,
    findings: list[Finding],
    candidates: list[Settings],
    *,
    budget_s: float,
    lock_free: bool = False,
) -> list[Verification]:
    """Measure each candidate settings against the original ones (those of `before`) in turns, as `measuring`
    says, within about `budget_s` seconds; one Verification per candidate, in order. With `lock_free`, the
    candidates' workers make their file-lock calls on read-only files no-ops (the original's as they are): a
    lock's cost measured, judged as a gain in speed whatever the findings."""
    kind = "speed" if lock_free else fix_kind(findings)
    clock = measuring.clock
    if before.outcome != "completed":
        share = budget_s / max(1, len(candidates))
        return [_alone(measuring, before, c, share, lock_free) for c in candidates]
    deadline = clock() + budget_s
    sessions: list[ProbeSession | None] = []
    errors: list[str | None] = []
    data_free: DataFreeWindows | None = None  # the loop's ceiling, with a step to measure it by
    try:
        for number, settings in enumerate([before.settings, *candidates]):
            startup_limit = deadline_allowance(max(1.0, (deadline - clock()) / 4))
            session, error = _started(measuring, settings, startup_limit, lock_free=lock_free and number > 0)
            sessions.append(session)
            errors.append(error)
        original_session = sessions[0]
        if measuring.step is not None and original_session is not None and original_session.ran:
            data_free = DataFreeWindows(measuring.step, original_session.held_batch, clock)
        _take_turns([s for s in sessions if s is not None and s.ran], deadline, clock, data_free)
    finally:
        recordings = [None if s is None else s.close() for s in sessions]
        if data_free is not None:
            data_free.close()
    original = recordings[0]
    results = []
    for settings, recording, error in zip(candidates, recordings[1:], errors[1:], strict=True):
        if original is None or recording is None:
            why = errors[0] if original is None else error
            results.append(_not_measured(settings, before, f"not measured: {why}"))
        else:
            verification = compare(original, recording, kind)
            if data_free is not None and data_free.rate is not None:
                verification.ceiling, verification.ceiling_windows = data_free.rate, data_free.windows
            results.append(verification)
    return results


def _started(
    measuring: Measuring, settings: Settings, startup_limit_s: float, *, lock_free: bool = False
) -> tuple[ProbeSession | None, str | None]:
    """A session of `settings` past its start-up, or None and why it could not be made."""
    try:
        session = ProbeSession(measuring, settings, lock_free=lock_free)
    except LoaderDoctorError as error:
        log.info("settings %s could not be measured: %s", settings, error)
        return None, error.message
    try:
        session.start(startup_limit_s=startup_limit_s)
    except BaseException:
        session.close()
        raise
    return session, None


def _take_turns(
    sessions: list[ProbeSession],
    deadline: float,
    clock: Callable[[], float],
    data_free: DataFreeWindows | None = None,
) -> None:
    """Rounds of one window per session, the order reversed every other round, until the time is spent; each
    round also a window of `data_free`, half as long (the step alone needs no warm-up and varies little), after
    the sessions' in one round and before them in the next."""
    if not sessions:
        return
    per_round = len(sessions) + (DATA_FREE_SHARE if data_free is not None else 0.0)
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
        if data_free is not None and number % 2:
            data_free.run(window_s * DATA_FREE_SHARE)
        for session in order:
            session.run(window_s, warm_up=True, min_batches=MIN_WINDOW_BATCHES)
            if session.iterator is not None and session.settings.backend == "thread":
                # The threads of a paused session would be alive when another session forks its workers.
                session.end_epoch("time")
        if data_free is not None and not number % 2:
            data_free.run(window_s * DATA_FREE_SHARE)


def _alone(
    measuring: Measuring, before: Recording, settings: Settings, budget_s: float, lock_free: bool
) -> Verification:
    """A fix for settings that stalled or crashed: measured on its own (there is no rate to compare with)."""
    session, error = _started(measuring, settings, deadline_allowance(budget_s), lock_free=lock_free)
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
