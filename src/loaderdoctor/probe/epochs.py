"""EpochLoop: how the probe runs its epochs, as a training loop would: iter(), each batch through the training
step, epochs recorded as they end, and how a failure ends one (a stall, a worker's death, samples that raise)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from loaderdoctor.errors import LoaderDoctorError, StopMeasuring
from loaderdoctor.loader.indexed import parse_sample_failures, parse_worker_init_failure
from loaderdoctor.loader.settings import Settings
from loaderdoctor.loader.workload import Step
from loaderdoctor.plain.usercode import describe_exception
from loaderdoctor.recording.epochbook import EpochBook
from loaderdoctor.recording.record import Recording, SampleError
from loaderdoctor.tap.interrupt import Interrupted, MainThreadInterrupter
from loaderdoctor.tap.iterator import Tap, TapIterator, is_worker_death
from loaderdoctor.workers.currentindex import InHand
from loaderdoctor.workers.deaths import worker_death
from loaderdoctor.workers.poller import thread_run_delay_s
from loaderdoctor.workers.processes import exited_workers

# A loader whose every batch fails is broken, not unlucky: stop measuring it after this many in a row.
_MAX_CONSECUTIVE_FAILURES = 50


class EpochLoop:
    """The epochs of a ProbeSession (probe.py), which sets these attributes."""

    settings: Settings
    step: Step | None
    clock: Callable[[], float]
    consumer: threading.Thread
    interrupter: MainThreadInterrupter
    rec: Recording
    book: EpochBook  # the tap's events written into rec (ProbeSession.on_event)
    tap: Tap
    iterator: TapIterator | None  # the open epoch's
    last_iterator: TapIterator | None  # the last epoch's, whose workers may persist
    epoch: int
    step_times: list[float]
    last_step_end: float
    held_batch: Any  # the last batch delivered, referenced until the next one is
    started: float
    _counted: int
    startup_count: int
    in_hand: InHand | None  # where workers note the index they load
    oom_kills_before: int | None  # the OOM killer's count as the run began

    def report_progress(self) -> None:
        raise NotImplementedError

    def _open_epoch(self) -> bool:
        """iter() for the next epoch; whether it opened (a worker of the last epoch may die as it begins)."""
        self.epoch += 1
        self.report_progress()
        try:
            self.iterator = self.last_iterator = self.tap.epoch(self.epoch)
        except RuntimeError as error:
            if self._failure(self.epoch, 0, error) is None:
                raise
            self.iterator = None
            return False
        # How many of the epoch's first batches are start-up, as recording.startup_batches counts them.
        self.startup_count = self.book.open.startup if self.book.open is not None else 1
        return True

    def end_epoch(self, ended: str) -> None:
        """Record the open epoch, ending its workers unless they persist (as a training loop's next iter()
        would); `ended` says how it ended."""
        iterator = self.iterator
        self.iterator = None
        if iterator is None:
            return
        if not self.settings.persistent_workers or ended in ("stall", "worker-died", "error"):
            close_iterator(iterator)
        now = self.clock()
        epoch = self.book.open
        if epoch is not None:
            end_s = max(0.0, now - max(self.last_step_end, epoch.started)) if epoch.batches else 0.0
            self.book.close(ended, at=now, end_s=end_s)
        if ended == "time":
            # Threads stopped in the middle of an epoch finish the batches they were loading; a loop of whole
            # epochs never starts its next epoch beside that work: the next epoch starts once they have ended.
            wait_stopped = getattr(iterator.inner, "wait_stopped", None)
            if wait_stopped is not None:
                wait_stopped()

    def _failure(self, epoch: int, batch: int, error: BaseException) -> str | None:
        """How `error` ends the run ("stall", "worker-died") with the outcome recorded; None when it does not
        (a sample that raised)."""
        if self.rec.stall is not None:
            self.rec.outcome = "stalled"
            return "stall"
        iterator = self.tap.torch_iterator()
        if is_worker_death(error, iterator):
            held = self.in_hand.read if self.in_hand is not None else (lambda worker_id: None)
            death = worker_death(iterator, epoch, batch, error, held=held, oom_kills_before=self.oom_kills_before)
            self.rec.worker_deaths.append(death)
            self.rec.outcome = "crashed"
            return "worker-died"
        return None

    @contextlib.contextmanager
    def deaths_recorded(self) -> Iterator[None]:
        """Around the session's own work between batches (warming up, sampling, opening a window): torch's SIGCHLD
        handler raises a worker's death wherever the main thread is, there too (the watchdog's kill of stalled
        workers, a worker that died). Recorded as the run's failure, as next() would have met it; not raised."""
        try:
            yield
        except RuntimeError as error:
            iterator = self.iterator
            if self._failure(self.epoch, iterator.index - 1 if iterator is not None else 0, error) is None:
                raise

    def _consume(
        self, deadline: float, min_batches: int, give_up: float | None, steady: bool
    ) -> tuple[str | None, int]:
        """Run the open epoch's batches through the step until `deadline` with `min_batches` delivered (or until
        `give_up`): how the epoch ended ("exhausted", "stall", "worker-died", "error"; None when it goes on),
        and the batches delivered that count (only steady ones if `steady`)."""
        iterator = self.iterator
        assert iterator is not None
        self._counted = 0
        try:
            ended = self._consume_batches(iterator, deadline, min_batches, give_up, steady)
        except RuntimeError as error:
            # torch's SIGCHLD handler raises a worker's death wherever the main thread is, not only in next().
            ended = self._failure(self.epoch, iterator.index - 1, error)
            if ended is None:
                raise
        return ended, self._counted

    def _consume_batches(
        self,
        iterator: TapIterator,
        deadline: float,
        min_batches: int,
        give_up: float | None,
        steady: bool,
    ) -> str | None:
        failures_in_a_row = 0
        while True:
            try:
                self.interrupter.armed = True
                try:
                    batch = next(iterator)
                finally:
                    self.interrupter.armed = False
            except StopIteration:
                return "exhausted"
            except Interrupted:
                self.rec.outcome = "stalled"
                return "stall"
            except Exception as error:
                ended = self._failure(self.epoch, iterator.index - 1, error)
                if ended is not None:
                    return ended
                init_error = parse_worker_init_failure(error)
                if init_error is not None:  # every batch of that worker fails: the loader cannot run
                    self.rec.worker_init_error = init_error
                    self.rec.outcome = "crashed"
                    self.rec.error = f"worker_init_fn raised {init_error}"
                    return "error"
                self._record_sample_error(self.epoch, iterator.index - 1, error)
                failures_in_a_row += 1
                if failures_in_a_row >= _MAX_CONSECUTIVE_FAILURES:
                    self.rec.outcome = "crashed"
                    self.rec.error = f"{failures_in_a_row} batches in a row failed; the last: {error}"
                    return "error"
                continue
            failures_in_a_row = 0
            # As in `for batch in loader:`, the previous batch stayed referenced until next() returned this one
            # (across windows and epochs too) and is released here. Freed before next() instead, a large batch
            # at the top of the heap is handed back to the system (glibc trims it), and loading in the main
            # process pays a page fault for every page of the next one (demo's 6 MB batches: 3,000 faults, ~8%
            # of its rate), which a training loop does not pay. Releasing it is the loop's time as much as the
            # step is, and counted with it (BatchRecord.step_s): memory-heavy's 64 MB batches take 5 ms to free
            # in the main process and 15 ms from shared memory, a third of its interval.
            self.held_batch = batch
            delivered = self.rec.batches[-1]
            delivered.step_s = max(0.0, self.clock() - self.started - delivered.delivered_s)
            if self.step is not None:
                delay_before = thread_run_delay_s()
                self._run_step(batch)
                delay_after = thread_run_delay_s()
                if delay_before is not None and delay_after is not None:
                    delivered.step_run_delay_s = min(delivered.step_s, max(0.0, delay_after - delay_before))
            self.last_step_end = self.clock()
            if not steady or iterator.delivered > self.startup_count:
                self._counted += 1
            self.report_progress()
            now = self.clock()
            if (now >= deadline and self._counted >= min_batches) or (give_up is not None and now >= give_up):
                return None

    def _run_step(self, batch: Any) -> None:
        step_started = self.clock()
        try:
            self.step(batch)  # type: ignore[misc]
        except StopMeasuring:
            self._record_step(step_started)
            raise  # the step ends the window here (see ProbeSession.run)
        except Exception as error:
            if is_worker_death(error, self.tap.torch_iterator()):
                raise  # a worker died while the step ran: not the step's fault
            raise LoaderDoctorError(
                f"the training step raised {describe_exception(error)}",
                hint="the step given with Workload(step=...) must accept one batch as the loader yields it",
            ) from error
        self._record_step(step_started)

    def _record_step(self, step_started: float) -> None:
        step_s = self.clock() - step_started
        self.rec.batches[-1].step_s += step_s
        self.step_times.append(step_s)
        self.last_step_end = self.clock()

    def _record_sample_error(self, epoch: int, batch: int, error: BaseException) -> None:
        for index, error_type, message in parse_sample_failures(error):
            self.rec.sample_errors.append(SampleError(epoch, batch, index, error_type, message))


def close_iterator(iterator: TapIterator) -> None:
    """End an iterator's workers; a death torch reports meanwhile is already recorded, or was expected."""
    died_before = bool(exited_workers(iterator.inner))
    try:
        iterator.close()
    except RuntimeError:
        if not died_before:
            raise
