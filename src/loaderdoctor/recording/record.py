"""A Recording: plain, JSON-ready data of one measured run of a loader, and which of its batches are steady (the
rate it gives is in rates.py)."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

# The parts of a Recording that lower layers produce live in those layers; the layers above may import them
# from here too (`X as X`: kept for them alone, unused here).
from loaderdoctor.host.facts import HostFacts, OtherProcess
from loaderdoctor.host.facts import StrayProcess as StrayProcess
from loaderdoctor.host.forkhazards import AliveThread as AliveThread
from loaderdoctor.host.forkhazards import IteratorFacts
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.data import dataclass_from_dict
from loaderdoctor.plain.frames import StackFrame as StackFrame
from loaderdoctor.tap.ceiling import Ceiling
from loaderdoctor.workers.activity import WorkerActivity
from loaderdoctor.workers.deaths import WorkerDeath
from loaderdoctor.workers.readings import HostReading, WorkerReading, WorkerStack


@dataclass
class EpochRecord:
    epoch: int
    first_batch_s: float | None  # from iter() to the first batch; None when none came
    batches: int
    wall_s: float  # from iter(), as first_batch_s, to the epoch's end
    worker_pids: list[int]
    ended: str  # "exhausted" | "time" | "stall" | "worker-died" | "error" | "left" (a watched loop left it early)
    started_s: float = 0.0  # when iter() was called, in seconds since the run started
    end_s: float = 0.0  # from the last batch's step to the epoch's end: StopIteration and ending its workers
    # Time in iter() itself: starting workers, or (persistent ones) taking in what the last epoch left in flight.
    iter_s: float = 0.0
    # Samples fingerprinted (IterableDatasets only: see fingerprints.py), how many of them were distinct, and
    # how many copies of a sample were typical (2 when each of 2 workers repeats the whole stream).
    samples_fingerprinted: int = 0
    distinct_samples: int | None = None
    typical_copies: int | None = None
    # The epoch a shuffling sampler with set_epoch() (DistributedSampler) held at this epoch's iter(), when the
    # loader has one: the same value every epoch means set_epoch() was never called (the same order each epoch).
    # Only a watched run records it: the probe drives epochs itself and calls no set_epoch().
    sampler_epoch: int | None = None
    # Of first_batch_s, for an epoch whose iter() started workers: the time its first worker was runnable but
    # descheduled since it started (other processes held the cores; see BatchDelivered.startup_run_delay_s).
    first_batch_run_delay_s: float | None = None
    # Iterators a guard started again within this epoch, after a worker's death or a stall (the loop went on).
    restarts: int = 0


@dataclass
class BatchRecord:
    epoch: int
    index: int  # the batch's number within its epoch
    wait_s: float  # time blocked in next()
    wait_cpu_s: float  # CPU time the main process used meanwhile (all of loading, without workers)
    step_s: float  # the loop's time after it, to the next next(): the training step, releasing the last batch
    nbytes: int
    samples: int
    delivered_s: float = 0.0  # when next() returned it, in seconds since the run started
    # Of wait_s, the time the training loop's thread was runnable but not running: other processes held the cores
    # (schedstat's run delay). Not a wait for data: see wait_fraction. None where the kernel does not count it.
    wait_run_delay_s: float | None = None
    # Of step_s, the time the loop's thread was runnable but not running: the cores taken by other processes, or
    # by this loader's own workers. Not the step's cost: see the limit. None where not counted.
    step_run_delay_s: float | None = None
    # One of the first batches of an iterator a guard started again within the epoch (one per worker it started):
    # its wait holds that restart, not steady running (see steady_batches).
    after_restart: bool = False


@dataclass
class Window:
    """A stretch of steady running (after start-up) whose batches are compared with another's."""

    started_s: float  # seconds since the run started
    ended_s: float


@dataclass
class SampleError:
    epoch: int
    batch: int
    index: int | None  # the dataset index, when the dataset is map-style
    error_type: str
    message: str


@dataclass
class Stall:
    epoch: int
    batch: int  # the batch that never came
    waited_s: float
    threshold_s: float
    reason: str
    stacks: list[WorkerStack] = field(default_factory=list)
    workers_cpu_idle: bool | None = None
    over_budget: bool = False  # declared because the measuring budget ran out, not by the stall policy

    @property
    def hung(self) -> bool:
        """Whether this was a hang, not a slow batch that outlasted the budget while workers still computed."""
        return not self.over_budget or self.workers_cpu_idle is True


@dataclass
class Recording:
    settings: Settings
    start_method: str | None
    batch_size: int | None
    batches_per_epoch: int | None
    iterable: bool
    step_s: float | None  # the training step per batch, None when there is none
    budget_s: float
    host: HostFacts
    iterators: list[IteratorFacts] = field(default_factory=list)
    epochs: list[EpochRecord] = field(default_factory=list)
    batches: list[BatchRecord] = field(default_factory=list)
    # The worker poller's readings of the workers and of the machine (their JSON keys keep the names reports were
    # saved with: 'samples' here are readings of processes, not a dataset's samples).
    worker_samples: list[WorkerReading] = field(default_factory=list)
    host_samples: list[HostReading] = field(default_factory=list)
    # Where the workers' main threads spent their time, by line, and their file-lock calls, sampled from inside
    # each worker process (see workers/sites.py); None without worker processes.
    worker_activity: WorkerActivity | None = None
    windows: list[Window] = field(default_factory=list)
    other_processes: list[OtherProcess] = field(default_factory=list)
    sample_errors: list[SampleError] = field(default_factory=list)
    stall: Stall | None = None
    worker_deaths: list[WorkerDeath] = field(default_factory=list)
    pickled_dataset_bytes: int | None = None
    # Why workers started with forkserver or spawn could not load this loader; computed when fork was hazardous.
    forkserver_blocker: str | None = None
    dataset: str = ""  # the dataset's class name
    dataset_len: int | None = None
    loader_class: str = ""  # the loader's class ("module.Name") when it is not torch's DataLoader itself
    outcome: str = "completed"  # "completed" | "stalled" | "crashed"
    error: str | None = None
    # The worker_init_fn's error ("ValueError: no config (at data.py:12 in init_worker)"): it fails every batch.
    worker_init_error: str | None = None
    wall_s: float = 0.0
    # Every batch delivered, when `batches` keeps only an even thinning of a long watched run (see watch/); None
    # when `batches` holds them all.
    batches_delivered: int | None = None
    # A watched loader's drop_last, and its DistributedSampler's (None without one): what a DDP plan needs.
    drop_last: bool | None = None
    sampler_drop_last: bool | None = None
    # The loop's rate with its input taken away, measured in data-free turns (`run --ceiling`); None otherwise.
    ceiling: Ceiling | None = None
    # A watched loader's sampler (loader/facts.py's LoaderFacts): the class that picks its indices, whether it
    # splits them between ranks (None where not recorded: reports saved before, the probe's), and the indices it
    # gives one rank in an epoch.
    sampler: str = ""
    sampler_distributed: bool | None = None
    samples_per_epoch: int | None = None
    # What a watched run drew in its first epoch (at most loader/facts.py's MAX_DRAWN): the dataset indices its
    # sampler gave the loader's own iterator (a map-style dataset; None where none were noted, see tap/drawn.py),
    # and the fingerprints of the samples delivered (an IterableDataset). What run compares between ranks.
    drawn_indices: list[int] | None = None
    drawn_fingerprints: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recording:
        """The Recording whose to_dict() is `data` (as a rank sends it to the launcher, through JSON)."""
        return dataclass_from_dict(cls, data)


def in_window(rec: Recording, batch: BatchRecord, window: Window | None) -> bool:
    """Whether a batch was delivered in `window`; without one, in any of the run's measuring windows (every
    batch counts when the run has none)."""
    windows = [window] if window is not None else rec.windows
    return not windows or any(w.started_s <= batch.delivered_s <= w.ended_s for w in windows)


def startup_batches(rec: Recording) -> dict[int, int]:
    """Per epoch, how many of its first batches are start-up rather than steady running: one per worker when
    the epoch started its workers (workers take turns, so worker k's first batch is the epoch's batch k, and
    its wait holds that worker's start-up), else the first batch only (its wait is the epoch's start)."""
    counts: dict[int, int] = {}
    previous: list[int] | None = None
    for epoch in rec.epochs:
        counts[epoch.epoch] = startup_count(epoch.worker_pids, previous)
        previous = epoch.worker_pids
    return counts


def workers_started(worker_pids: list[int], previous_pids: list[int] | None) -> bool:
    """Whether an epoch's iter() started its workers: it has workers, and not the last epoch's."""
    return bool(worker_pids) and worker_pids != previous_pids


def startup_count(worker_pids: list[int], previous_pids: list[int] | None) -> int:
    """How many of an epoch's first batches are start-up, given its workers and the last epoch's: one per worker
    when its iter() started them, else the first batch only."""
    return max(1, len(worker_pids)) if workers_started(worker_pids, previous_pids) else 1


def steady_batches(rec: Recording, window: Window | None = None) -> list[BatchRecord]:
    """Batches delivered in steady running: after the start-up batches of each epoch (see startup_batches;
    counted apart) and of each restart a guard made, within `window` (by default, within the run's measuring
    windows)."""
    startup = startup_batches(rec)
    seen: set[int] = set()  # epochs whose first delivered batch went by (batch 0 may have failed)
    steady = []
    for batch in rec.batches:
        running = batch.index >= startup.get(batch.epoch, 1) and not batch.after_restart
        if batch.epoch in seen and running and in_window(rec, batch, window):
            steady.append(batch)
        seen.add(batch.epoch)
    return steady


def mean_batch_bytes(rec: Recording) -> float | None:
    """The mean size of a delivered batch in bytes; None when none was delivered."""
    return statistics.mean(b.nbytes for b in rec.batches) if rec.batches else None


def loads_in_the_loop(rec: Recording) -> bool:
    """Whether loading runs in the training loop's own thread, inside next() (no workers): then the time that
    thread was descheduled in next() was loading's time, as slow as the machine's load makes it."""
    return rec.settings.num_workers == 0


def data_wait_s(batch: BatchRecord, *, loads_in_the_loop: bool = False) -> float:
    """The time the loop waited in next() for this batch's data. Where workers load, its wait less the time the
    loop's own thread was runnable but descheduled meanwhile (other processes held the cores: the machine's load,
    not the data's). Where the loop's thread loads, all of its wait: descheduled or not, that thread was loading."""
    if loads_in_the_loop:
        return batch.wait_s
    return max(0.0, batch.wait_s - (batch.wait_run_delay_s or 0.0))


# Less of next()'s wait than this descheduled, on average, is not worth a word in a report.
NOTABLE_DESCHEDULED_WAIT_S = 0.0005


def descheduled_wait_s(rec: Recording, window: Window | None = None) -> float | None:
    """The mean, over steady batches, of the part of next()'s wait that the loop's thread was descheduled, left
    out of the wait for data (see data_wait_s); None where it was not counted, or where the loop's thread loads
    (nothing is left out then)."""
    if loads_in_the_loop(rec):
        return None
    delays = [b.wait_run_delay_s for b in steady_batches(rec, window) if b.wait_run_delay_s is not None]
    return statistics.mean(delays) if delays else None


def wait_fraction(rec: Recording, window: Window | None = None) -> float | None:
    """Share of steady-state time the training loop spent waiting in next() for data (data_wait_s: where workers
    load, the time it was itself descheduled left out); None without a training step."""
    if rec.step_s is None:
        return None
    steady = steady_batches(rec, window)
    total = sum(b.wait_s + b.step_s for b in steady)
    in_loop = loads_in_the_loop(rec)
    return sum(data_wait_s(b, loads_in_the_loop=in_loop) for b in steady) / total if total > 0 else None


def startup_s(rec: Recording) -> float:
    """Seconds spent from each iter() to its epoch's first batch, all epochs together."""
    return sum(e.first_batch_s or 0.0 for e in rec.epochs)
