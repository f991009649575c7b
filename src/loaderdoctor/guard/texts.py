"""How the guard words what happens in its events and errors: stalls, deaths, restarts, skipped samples, and
the errors that end a run."""

from __future__ import annotations

from typing import Any

from loaderdoctor.errors import LoaderDoctorError, LoaderGaveUp
from loaderdoctor.guard.events import GuardEvent
from loaderdoctor.guard.samples import BAD_SHARE_CONFIDENCE, bad_share_floor
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.words import plural
from loaderdoctor.recording.record import WorkerStack
from loaderdoctor.tap.watchdog import StallNotice

INDICES_SHOWN = 20  # bad sample indices named in the error that ends a run with too many


def stuck_text(stacks: list[WorkerStack]) -> str:
    """Where each worker is stuck, as the guard's messages name it."""
    stuck = [where for s in stacks if (where := s.stuck_at()) is not None]
    if stuck:
        return "; ".join(stuck)
    if stacks:
        return "no frame in the stacks (pids " + ", ".join(str(s.pid) for s in stacks) + ")"
    return "no stack could be taken"


def stall_event(
    notice: StallNotice, batch: int, settings: Settings, stacks: list[WorkerStack], *, interrupted: bool
) -> GuardEvent:
    """A stall at the epoch's `batch`, with the stacks taken and what the guard does about it."""
    if notice.pids:
        then = f"ending workers {', '.join(map(str, notice.pids))} to restart"
    elif interrupted:
        then = "loading runs in the main process: interrupting it"
    else:
        then = (
            "loading runs in the main process outside the main thread's next(), where the guard cannot "
            "interrupt it, so it waits on"
        )
    return GuardEvent(
        "stall",
        notice.epoch,
        batch,
        f"loaderdoctor guard: stall at epoch {notice.epoch}, batch {batch}: {notice.reason}; "
        f"stuck at {stuck_text(stacks)}; {then}",
        {
            "waited_s": round(notice.waited_s, 3),
            "threshold_s": round(notice.threshold_s, 3),
            "reason": notice.reason,
            "pids": list(notice.pids),
            "settings": settings.to_dict(),
            "stacks": [
                {
                    "pid": s.pid,
                    "stuck_frame": None if (frame := s.stuck_frame) is None else str(frame),
                    "frames": [str(f) for f in s.frames],
                }
                for s in stacks
            ],
        },
    )


def death_event(
    epoch: int,
    position: int,
    cause: str,
    pids: list[int],
    loading: list[tuple[int, Any]] | None,
    killer: int | None = None,
) -> GuardEvent:
    """A worker's death; `pids` the workers that ended, `loading` the plan positions and indices of the batches
    they had in hand, `killer` the dataset index being loaded when it died, when known."""
    message = f"loaderdoctor guard: worker died at epoch {epoch}, batch {position}: {cause}"
    detail: dict[str, Any] = {"error": cause, "pids": pids, "index": killer}
    if loading is not None:
        message += f"; {loading_text(loading)}"
        detail["in_hand"] = [{"batch": position, "indices": indices} for position, indices in loading]
    if killer is not None:
        message += f"; it died loading dataset index {killer}"
    return GuardEvent("worker-died", epoch, position, message, detail)


def loading_text(loading: list[tuple[int, Any]]) -> str:
    """The batches a dead worker had in hand, in words."""
    named = [
        f"batch {position}" + ("" if indices is None else f" (dataset indices {indices})")
        for position, indices in loading
    ]
    return f"it had {' and '.join(named)} in hand"


def restart_event(
    kind: str, epoch: int, position: int, where: str, restart: int, max_restarts: int, change: tuple[Settings, Settings]
) -> tuple[str, dict[str, Any]]:
    """The message and detail of a restart from `change` = (failed, rung) settings; `where` the batch it
    resumes at."""
    failed, settings = change
    how = (
        f"with {settings.describe()} (was {failed.describe()})"
        if settings != failed
        else f"again with {settings.describe()}"
    )
    message = (
        f"loaderdoctor guard: restart {restart} of at most {max_restarts} after a {kind}: epoch {epoch} resumes "
        f"at {where} {how}"
    )
    detail = {
        "reason": kind,
        "restart": restart,
        "resume_at": position,
        "before": failed.to_dict(),
        "after": settings.to_dict(),
    }
    return message, detail


def skipped_event(epoch: int, position: int, report: dict[str, Any]) -> GuardEvent:
    """A sample replaced under on_sample_error="skip", from the report of the process that loaded it."""
    index = report["index"]
    return GuardEvent(
        "sample-skipped",
        epoch,
        position,
        f"loaderdoctor guard: sample {index} skipped at epoch {epoch}, batch {position}: "
        f"{report['error_type']}: {report['message']}; sample {report['replacement']} loaded in its place",
        {
            "index": index,
            "replacement": report["replacement"],
            "error_type": report["error_type"],
            "message": report["message"],
            "traceback": report["traceback"],
        },
    )


def too_many_bad_error(
    epoch: int, position: int, skipped: list[int], seen: int, max_bad_fraction: float, last: dict[str, Any]
) -> LoaderDoctorError:
    """The error that ends a run whose bad share passed max_bad_fraction; `last` the last skip's detail."""
    bad = len(skipped)
    shown = ", ".join(map(str, skipped[:INDICES_SHOWN]))
    if bad > INDICES_SHOWN:
        shown += f" and {bad - INDICES_SHOWN} more (loader.skipped lists them all)"
    return LoaderDoctorError(
        f"the guarded DataLoader stopped at epoch {epoch}, batch {position}: {bad} of the {seen} samples "
        f"seen failed to load: a bad share of at least {bad_share_floor(bad, seen):.1%} (at "
        f"{BAD_SHARE_CONFIDENCE:.1%} confidence), over max_bad_fraction={max_bad_fraction:g}. "
        f"Bad indices: {shown}. Last error: "
        f"dataset[{last['index']}] raised {last['error_type']}: {last['message']}",
        hint="each sample-skipped event on loader.events holds its error and traceback: fix or remove those "
        "samples, or allow a larger share with max_bad_fraction",
    )


def gave_up_error(
    kind: str,
    where: str,
    tried: list[Settings],
    restarts: int,
    max_restarts: int,
    why_no_rung: str,
    stacks: list[WorkerStack],
    error: BaseException | None,
    loading: list[tuple[int, Any]] | None = None,
    killer: int | None = None,
) -> LoaderGaveUp:
    """The error that ends a run with no restart or rung left; `where` the epoch and batch, `why_no_rung` why
    the ladder ended before max_restarts (empty when restarts ran out)."""
    what = "a stall" if kind == "stall" else "a worker died"
    message = (
        f"the guarded DataLoader gave up at {where}: {what}, after {plural(restarts, 'restart')} "
        f"(max_restarts={max_restarts}). Settings tried: {' -> '.join(s.describe() for s in tried)}."
    )
    if restarts < max_restarts:
        message += why_no_rung
    if kind == "stall":
        message += f" Stuck at: {stuck_text(stacks)}."
    elif error is not None:
        message += f" Last error: {error}"
        if loading is not None:
            message += f"; {loading_text(loading)}"
        if killer is not None:
            message += (
                f"; it died loading dataset index {killer}, which may crash any process that loads it "
                '(on_sample_error="skip" skips such a sample)'
            )
        elif loading is not None:
            message += ": a sample there may crash any process that loads it"
    return LoaderGaveUp(
        message,
        hint="the stuck frame is where loading waits (a lock, a read that never returns, a library "
        "deadlocked by fork): fix it there; or allow more restarts (max_restarts)",
    )
