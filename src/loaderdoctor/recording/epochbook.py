"""EpochBook: the tap's events written into a Recording's batch and epoch records, one bookkeeping for the probe
and a watched run alike (an epoch's start-up batches, first batch, workers, iter() time and samples seen); what
differs between them is only who owns the loop, and so who says when a step and an epoch end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from loaderdoctor.recording.record import BatchRecord, EpochRecord, Recording, startup_count, workers_started
from loaderdoctor.tap.events import BatchDelivered, BatchFailed, IteratorCreated, WorkersStarted
from loaderdoctor.tap.fingerprints import EpochTally


@dataclass
class OpenEpoch:
    """The epoch under way, from its iter() on: running totals over every batch delivered (a long watched run
    keeps only some of their records), and what its EpochRecord will say."""

    epoch: int
    started: float  # clock() when iter() was called
    worker_pids: list[int]
    startup: int  # its first batches that are start-up (see record.startup_count)
    iter_s: float = 0.0  # the time in iter() itself
    first_batch_s: float | None = None
    first_batch_run_delay_s: float | None = None
    batches: int = 0  # delivered
    failed: int = 0  # next() calls that raised (a sample, a worker's death): they take a batch's place too
    wait_s: float = 0.0
    step_s: float = 0.0  # of the steps whose end was seen
    samples: int = 0
    restarts: int = 0  # iterators a guard started again within this epoch
    restart_startup: int = 0  # batches still to come of the start-up of the last restart's workers
    sampler_epoch: int | None = None  # a shuffling sampler's epoch at its iter() (EpochRecord.sampler_epoch)
    seen: EpochTally = field(default_factory=EpochTally)  # its samples' fingerprints
    new_workers: bool = False  # its iter() started workers (other pids than the epoch before)


class EpochBook:
    """Keeps `rec`'s batches and epochs from the tap's events: created() at each iter(), delivered() at each batch
    (the caller keeps the BatchRecord, or not), close() when the owner of the loop says the epoch ended."""

    def __init__(self, rec: Recording, clock: Callable[[], float], started: float) -> None:
        self.rec = rec
        self.clock = clock
        self.started = started  # clock() when the run began: records' times are since then
        self.open: OpenEpoch | None = None
        self.last: OpenEpoch | None = None  # the last epoch opened, open or closed

    def created(self, event: IteratorCreated) -> OpenEpoch:
        """iter() made a new iterator for epoch `event.epoch`: it opens that epoch (the caller closed the last)."""
        if event.facts is not None:
            self.rec.iterators.append(event.facts)
        previous = self.rec.epochs[-1].worker_pids if self.rec.epochs else None
        pids = list(event.worker_pids)
        started = self.clock() - event.create_s
        startup, new_workers = startup_count(pids, previous), workers_started(pids, previous)
        self.open = self.last = OpenEpoch(event.epoch, started, pids, startup, event.create_s, new_workers=new_workers)
        return self.open

    def workers_started(self, event: WorkersStarted) -> None:
        """The open epoch's workers, found only at its first next() (see WorkersStarted): its start-up counted
        from them, as created() counts an iter()'s."""
        epoch = self.open
        if epoch is None or epoch.epoch != event.epoch:
            return
        previous = self.rec.epochs[-1].worker_pids if self.rec.epochs else None
        epoch.worker_pids = list(event.worker_pids)
        epoch.startup = startup_count(epoch.worker_pids, previous)
        epoch.new_workers = workers_started(epoch.worker_pids, previous)

    def startup_just_ended(self) -> bool:
        """Whether the batch just delivered was the last of the start-up of workers its epoch's iter() started:
        each of them has delivered its first batch."""
        epoch = self.open
        return epoch is not None and epoch.new_workers and epoch.batches == epoch.startup

    def restarted(self, event: IteratorCreated) -> None:
        """A guard's new iterator within the open epoch (the loop goes on past a worker's death)."""
        if event.facts is not None:
            self.rec.iterators.append(event.facts)
        if self.open is not None:
            self.open.restarts += 1
            self.open.restart_startup = max(1, len(event.worker_pids))

    def _epoch_of(self, event: BatchDelivered | BatchFailed, at: float) -> OpenEpoch:
        """The open epoch; one opened for a batch when no iter() was seen (a tap made mid-epoch)."""
        if self.open is None:
            self.open = self.last = OpenEpoch(event.epoch, at - event.wait_s, [], 1)
        return self.open

    def failed(self, event: BatchFailed) -> int:
        """next() raised: the batch's number in its epoch (counted with the delivered ones, as torch's sampler
        dealt it a place), whatever iterator a guard started meanwhile."""
        epoch = self._epoch_of(event, self.clock())
        epoch.failed += 1
        return epoch.batches + epoch.failed - 1

    def delivered(self, event: BatchDelivered, delivered_at: float) -> BatchRecord:
        """A batch delivered at clock() `delivered_at`, counted in its epoch; its record, step 0 until the loop's
        owner says how long the step took. Its index counts the epoch's failed batches too."""
        epoch = self._epoch_of(event, delivered_at)
        if event.first_batch_s is not None and epoch.first_batch_s is None:
            epoch.first_batch_s = event.first_batch_s
            epoch.first_batch_run_delay_s = event.startup_run_delay_s
        epoch.batches += 1
        epoch.wait_s += event.wait_s
        epoch.samples += event.samples
        epoch.seen.add(event.fingerprints)
        after_restart = epoch.restart_startup > 0
        epoch.restart_startup = max(0, epoch.restart_startup - 1)
        return BatchRecord(
            epoch=epoch.epoch,
            index=epoch.batches + epoch.failed - 1,
            wait_s=event.wait_s,
            wait_cpu_s=event.wait_cpu_s,
            step_s=0.0,
            nbytes=event.nbytes,
            samples=event.samples,
            delivered_s=delivered_at - self.started,
            wait_run_delay_s=event.wait_run_delay_s,
            after_restart=after_restart,
        )

    def close(self, ended: str, *, at: float | None = None, end_s: float = 0.0) -> EpochRecord | None:
        """The open epoch ended at clock() `at` (default: now), as `ended` says ("exhausted", "time", "left", ...):
        its EpochRecord, kept in the Recording; None when no epoch was open."""
        epoch = self.open
        if epoch is None:
            return None
        self.open = None
        now = self.clock() if at is None else at
        record = EpochRecord(
            epoch=epoch.epoch,
            first_batch_s=epoch.first_batch_s,
            first_batch_run_delay_s=epoch.first_batch_run_delay_s,
            batches=epoch.batches,
            wall_s=now - epoch.started,
            worker_pids=epoch.worker_pids,
            ended=ended,
            started_s=epoch.started - self.started,
            end_s=end_s,
            iter_s=epoch.iter_s,
            sampler_epoch=epoch.sampler_epoch,
            restarts=epoch.restarts,
            **epoch.seen.record_fields(),
        )
        self.rec.epochs.append(record)
        return record
