"""The one notion of a rate, read from a Recording: batches per second over an epoch as a training loop runs it."""

from __future__ import annotations

import itertools
import statistics

from loaderdoctor.recording.record import (
    BatchRecord,
    EpochRecord,
    Recording,
    Window,
    startup_batches,
    steady_batches,
)

# The one notion of a rate. A training loop's epoch costs its overhead (iter() to the first batch, and at its
# end StopIteration and the ending of workers that do not persist) plus, for each batch, the steady interval
# (the wait in next(), then the loop's time to the next next(): the step, and releasing the last batch).
# Rates are batches per second over such an epoch, as a plain loop running epoch after epoch measures them;
# the one start-up of persistent workers is paid once per run and reported apart (first_startup_s), not
# spread over epochs.


def interval_s(rec: Recording, window: Window | None = None) -> float | None:
    """The steady time from one batch to the next: mean wait plus step (None without steady batches)."""
    steady = steady_batches(rec, window)
    return sum(b.wait_s + b.step_s for b in steady) / len(steady) if steady else None


def epoch_batches(rec: Recording) -> int | None:
    """Batches in an epoch: the loader's length, else an epoch seen to its end; None when unknown (a stream)."""
    if rec.batches_per_epoch:
        return rec.batches_per_epoch
    exhausted = [e.batches for e in rec.epochs if e.ended == "exhausted"]
    return max(exhausted) if exhausted else None


def first_batch_as_a_loop_pays_s(previous: EpochRecord | None, epoch: EpochRecord) -> float | None:
    """An epoch's first batch from iter(), as a loop of whole epochs pays it. After an epoch the probe cut short
    at its time ("time") whose workers persist, iter() first takes in the batches that epoch left in flight, which
    such a loop never pays: that part (the epoch's iter_s) is left out. A watched loop that left an epoch early
    ("left") paid it, and keeps it. None when no batch came."""
    if epoch.first_batch_s is None:
        return None
    drained = (
        previous is not None
        and previous.ended == "time"
        and bool(epoch.worker_pids)
        and epoch.worker_pids == previous.worker_pids
    )
    return epoch.first_batch_s - (epoch.iter_s if drained else 0.0)


def epoch_overhead_s(rec: Recording) -> float:
    """What an epoch costs beyond its batches' steady intervals: its start-up batches' time above the steady
    interval, and its end. Measured at the epochs after the first when the run had them; with one epoch only,
    that epoch's for workers started anew every epoch, and nothing for persistent workers or the main process
    (their first start-up is once per run). After an epoch cut short (a probe's), persistent workers' iter()
    first takes in the batches that epoch left in flight: a training loop whose epochs run to their end never
    pays that, so it is left out."""
    interval = interval_s(rec) or 0.0
    persistent = rec.settings.num_workers > 0 and rec.settings.persistent_workers
    previous = {later.epoch: earlier for earlier, later in itertools.pairwise(rec.epochs)}
    startup = startup_batches(rec)
    by_epoch: dict[int, list[BatchRecord]] = {}
    for batch in rec.batches:
        if batch.index < startup.get(batch.epoch, 1):
            by_epoch.setdefault(batch.epoch, []).append(batch)

    def overhead(epoch: EpochRecord) -> float:
        firsts = by_epoch.get(epoch.epoch, [])
        # The first batch's wait from iter() on: creating the iterator starts the workers.
        first = first_batch_as_a_loop_pays_s(previous.get(epoch.epoch), epoch) or 0.0
        waits = sum(first if b.index == 0 else b.wait_s for b in firsts)
        used = waits + sum(b.step_s for b in firsts)
        return max(0.0, used - len(firsts) * interval + epoch.end_s)

    later = [e for e in rec.epochs[1:] if e.first_batch_s is not None]
    if later:
        return statistics.median(overhead(e) for e in later)
    first = rec.epochs[0] if rec.epochs else None
    if first is None or first.first_batch_s is None or persistent or rec.settings.num_workers == 0:
        return 0.0
    return overhead(first)


def training_rate(rec: Recording, window: Window | None = None) -> float | None:
    """Batches per second over an epoch of the training loop (see above); within `window` for the steady part
    when given. None when no steady batch was measured."""
    interval = interval_s(rec, window)
    if interval is None or interval <= 0:
        return None
    per_epoch = epoch_batches(rec)
    if per_epoch is None:
        return 1.0 / interval
    return per_epoch / (epoch_overhead_s(rec) + per_epoch * interval)


def rate_range(rec: Recording, parts: int = 3) -> tuple[float, float] | None:
    """The lowest and highest training rate over `parts` consecutive stretches of the steady batches (equal
    counts, each read as training_rate reads the whole): how much the run's own rate moved while it was measured.
    None with fewer than 4 steady batches a stretch."""
    steady = steady_batches(rec)
    size = len(steady) // parts
    if size < 4:
        return None
    per_epoch = epoch_batches(rec)
    overhead = epoch_overhead_s(rec) if per_epoch is not None else 0.0
    rates = []
    for part in range(parts):
        stretch = steady[part * size : (part + 1) * size]
        interval = sum(b.wait_s + b.step_s for b in stretch) / size
        if interval <= 0:
            return None
        rates.append(1.0 / interval if per_epoch is None else per_epoch / (overhead + per_epoch * interval))
    return min(rates), max(rates)


def epoch_rates(rec: Recording) -> dict[int, float]:
    """Each epoch's batches per second in the training loop: its batches over its time from iter() to its end,
    counted as the loop spent it (the first batch from iter(), every other batch's wait, every step, the end), so
    that a measuring session's pauses between windows do not count. Only epochs run to their end, unless none
    was; a thinned watched run (its batches a sample) by each epoch's wall time."""
    spent: dict[int, float] = {}
    for batch in rec.batches:
        wait = batch.wait_s if batch.index else 0.0  # the first batch's wait is in first_batch_s, from iter()
        spent[batch.epoch] = spent.get(batch.epoch, 0.0) + wait + batch.step_s
    whole = [e for e in rec.epochs if e.ended == "exhausted"] or rec.epochs
    rates = {}
    for epoch in whole:
        if rec.batches_delivered is not None:
            seconds = epoch.wall_s
        else:
            seconds = (epoch.first_batch_s or 0.0) + spent.get(epoch.epoch, 0.0) + epoch.end_s
        if epoch.batches and seconds > 0:
            rates[epoch.epoch] = epoch.batches / seconds
    return rates


def first_startup_s(rec: Recording) -> float | None:
    """From the first iter() to the first batch: the start-up every run pays once."""
    return rec.epochs[0].first_batch_s if rec.epochs else None


def delivered_batches(rec: Recording) -> int:
    """How many batches the run delivered (a long watched run keeps only a thinning of them in `batches`)."""
    return len(rec.batches) if rec.batches_delivered is None else rec.batches_delivered


def batches_per_s(rec: Recording) -> float:
    """Delivered batches per second of the whole run as it went, start-up included (see training_rate for the
    rate a training loop sees)."""
    return delivered_batches(rec) / rec.wall_s if rec.wall_s > 0 else 0.0
