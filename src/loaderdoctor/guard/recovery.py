"""What the guard makes of a failure, as pure functions: which kind it is (a stall, a worker's death, or the
user's own error) and which settings the next restart runs with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loaderdoctor.guard.children import GuardInterrupt
from loaderdoctor.guard.ladder import escalation, next_rung
from loaderdoctor.loader.settings import Settings
from loaderdoctor.tap.iterator import raised_in_worker

STALL, DIED = "stall", "worker-died"
USERS_TIMEOUT = "users-timeout"  # torch's error for the user's own DataLoader(timeout=...): theirs, batch not spent
ASK_WORKERS = "ask-workers"  # not known yet: a worker's death shows so too, if one ends within a short grace


@dataclass(frozen=True)
class FailureFacts:
    """What the guard knows of the iterator that failed."""

    num_workers: int
    stalled: bool  # the watchdog fired and ended the workers
    died: str | None  # a death the SIGCHLD handler saw
    users_timeout_s: float  # the user's DataLoader(timeout=...), 0 for none
    exited: list[int]  # its workers whose process has ended, when the error came
    waited_s: float  # how long the next() that raised had waited


def is_users_timeout(error: BaseException, facts: FailureFacts) -> bool:
    """Whether `error` is torch's when the user's own DataLoader(timeout=...) passed: theirs to see. Told by the
    clock (the next() waited that long, and torch raises a RuntimeError then) with every worker alive."""
    return (
        bool(facts.num_workers and facts.users_timeout_s)
        and isinstance(error, RuntimeError)
        and not facts.exited
        and facts.waited_s >= facts.users_timeout_s
        and not raised_in_worker(error)
    )


def classify(error: BaseException, facts: FailureFacts) -> str | None:
    """STALL, DIED, ASK_WORKERS (an error that is not the dataset's, with workers alive: a death if one ends
    within a short grace), USERS_TIMEOUT, or None: the user's to see (the dataset's own error, another
    loader's worker). Decided from what the guard saw and the workers' processes, never from message text."""
    if isinstance(error, GuardInterrupt) or facts.stalled:
        return STALL
    if raised_in_worker(error):
        return None
    if facts.exited or facts.died:
        return DIED
    if is_users_timeout(error, facts):
        return USERS_TIMEOUT
    return ASK_WORKERS if facts.num_workers else None


def death_cause(error: BaseException | None, died: str | None) -> str:
    """A worker's death in words: torch's report (the error it showed as), or what the SIGCHLD handler saw."""
    if isinstance(error, RuntimeError) and died is None:
        return str(error)
    if died is not None:
        return died + (" (seen between batches)" if error is None else "")
    return f"{type(error).__name__}: {error}"


@dataclass(frozen=True)
class Rung:
    """The settings of the next restart, and why, in words added to its event (may be empty)."""

    settings: Settings
    why: str = ""


def choose_rung(
    failed: Settings,
    kind: str,
    *,
    restarts_left: bool,
    escalated: bool,
    tried: list[Settings],
    picklable: Callable[[], bool],
    per_worker_streams: bool,
    killer_skipped: int | None = None,
    retried_as_was: bool = False,
) -> Rung | None:
    """Where loading goes after `kind` failed it at `failed`: one rung down the ladder (guard/ladder.py), or after
    a stall in the main process up to a worker (see after_main_stall); None when no restart or rung is left.
    `picklable()` says whether workers that are not forked can load the dataset (asked only when needed).
    After a death on a sample that is skipped from now on (`killer_skipped`), the settings stay: the sample
    was the cause, and it is no longer loaded. After a death with no safer rung (a dataset only forked workers
    can load, down to one worker), the workers start again as they were, once (`retried_as_was`: done already):
    a death may be the machine's (the OOM killer), not the loader's."""
    if not restarts_left:
        return None
    if kind == DIED and killer_skipped is not None:
        return Rung(
            failed,
            f": dataset index {killer_skipped}, which the worker was loading when it died, is skipped from now on "
            '(on_sample_error="skip")',
        )
    if escalated:
        return None
    if failed.num_workers == 0:
        return after_main_stall(failed, tried, picklable) if kind == STALL else None
    can_pickle = failed.effective_start_method != "fork" or picklable()
    rung = next_rung(failed, kind, picklable=can_pickle, per_worker_streams=per_worker_streams)
    if rung is None and kind == DIED and not retried_as_was:
        return Rung(failed, ": no safer settings can load this loader, so its workers start again as they were, once")
    return None if rung is None else Rung(rung)


def after_main_stall(failed: Settings, tried: list[Settings], picklable: Callable[[], bool]) -> Rung | None:
    """Where loading goes after the guard interrupted a stalled next() in the main process: to one worker
    started with spawn, which the guard can end if it stalls again (it can only interrupt the main process,
    whose state the interrupted code may have left half-changed); the main process again when the dataset or
    its functions cannot be sent to a worker. Once only: that worker is the last rung, so a loader never goes
    back and forth between the two; none when a single spawned worker was tried before (the ladder came down
    through it)."""
    if any(s.num_workers == 1 and s.effective_start_method == "spawn" for s in tried):
        return None
    if picklable():
        return Rung(
            escalation(failed),
            ": loading moves out of the main process, which the guard can only interrupt, to one worker "
            "started with spawn, which it can end if it stalls again; the last rung",
        )
    return Rung(
        failed,
        ": the dataset or its functions cannot be sent to a worker process (see the log), so loading stays "
        "in the main process",
    )
