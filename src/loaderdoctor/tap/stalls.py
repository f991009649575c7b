"""The one response to a stall, for the probe and the guard alike: take the stacks of what is stuck, let the
caller record them, then end the wait, by killing the stuck workers or interrupting the main thread's next()."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from threading import Thread

from loaderdoctor.tap.interrupt import MainThreadInterrupter
from loaderdoctor.tap.watchdog import StallNotice
from loaderdoctor.workers.poller import dump_worker_stacks, kill_workers, thread_stack
from loaderdoctor.workers.readings import WorkerStack


class Ended(Enum):
    """How a stalled wait was ended."""

    KILLED = "killed"  # the stuck workers were killed: torch's next() fails at once (or within its check)
    INTERRUPTED = "interrupted"  # the main thread's next() was sent the interrupt signal
    WAITING = "waiting"  # loading runs where no signal can end it (outside the main thread): it goes on


def respond_to_stall(
    notice: StallNotice,
    *,
    dump_dir: str,
    consumer: Thread,
    interrupter: MainThreadInterrupter | None,
    record: Callable[[list[WorkerStack]], None],
) -> Ended:
    """From the watchdog's thread: the stuck workers' stacks (or, without workers, the consuming thread's),
    handed to `record`, then the wait ended. The wait is ended even when taking the stacks or `record` raises
    (the error then propagates): a bug in what a stall is recorded with must not leave a job hanging."""
    try:
        record(dump_worker_stacks(notice.pids, dump_dir) if notice.pids else [thread_stack(consumer)])
    finally:
        if notice.pids:
            kill_workers(notice.pids)
            ended = Ended.KILLED
        elif interrupter is not None and interrupter.interrupt():
            ended = Ended.INTERRUPTED
        else:
            ended = Ended.WAITING
    return ended
