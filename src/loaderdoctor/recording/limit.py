"""The limit: the rate this host could reach for a loader and its step, from what one run measured, and which part
binds (loading's CPU, loading's waits on I/O, or the step).

Per steady batch: loading costs `cpu` CPU seconds (its workers' CPU per batch and the training process's CPU in
next(), or all of it in next() without workers) and waits `io` seconds besides (reads, sleeps: wall time a
loader spends per batch beyond its CPU, measurable while loading is what the step waits for). Then
- loading's CPU allows usable cores / cpu batches per second (the CPU the step itself takes counted too; the
  cores shared by the job's local ranks, each rank's limit its share of them);
- loading's I/O allows as many batches in flight as workers could overlap: MAX_IO_WORKERS / (io + cpu);
- the step allows 1 / (step + receive), receive being the training process's CPU in next() taking in a batch
  from worker processes (between two steps, whatever the loaders do; none known without workers).
The steady limit is the least of those known; a part that cannot be measured is left out and said why, never
guessed. Over an epoch of B batches (when B is known) the limit is B / (B / steady + boundary): torch's
DataLoader loads nothing across an epoch's end, so an epoch from iter() on takes its first batch's loading (one
loader's whole time for a batch, which the other loaders cannot shorten: measured, the first batch of an epoch
whose workers were already running; else one batch's CPU and waits, a lower bound where the waits are hidden),
then a steady interval (1 / steady) per further batch, then the last step with the loaders idle:
boundary = first batch - interval + last step. When the step binds, that is the first batch's loading; when
loading binds, the part of it that steady running overlaps is not paid again, its last step is."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Any

from loaderdoctor.recording.rates import epoch_batches, first_batch_as_a_loop_pays_s, interval_s
from loaderdoctor.recording.record import Recording, steady_batches
from loaderdoctor.recording.usage import loading_cpu, main_step_cpu_s, worker_cpu_per_batch

# Workers that could overlap waits on I/O at most (the rules' MAX_IO_WORKERS: beyond, memory and open files cost
# more than the reads in flight gain).
MAX_IO_WORKERS = 16
# Below this share of a batch's loading time, waits on I/O are noise around the CPU's figure: no I/O part.
MIN_IO_SHARE = 0.2
# Loading is what the step waits for when the loop waits at least this share of the time: only then does a
# batch's interval show how long a loader takes per batch.
LOADING_SHOWS = 0.05

BINDS = ("loading-cpu", "loading-io", "step")


@dataclass(frozen=True)
class Limit:
    """The rate this host could reach, its parts, and what binds; batches_per_s is None when no part is known,
    with `unknown` saying why each missing part could not be measured."""

    batches_per_s: float | None
    binds: str | None  # one of BINDS, or None when nothing is known
    loading_cpu_batches_per_s: float | None
    loading_io_batches_per_s: float | None
    step_batches_per_s: float | None
    cpu_s_per_batch: float | None  # loading's CPU per batch, workers' and the training process's in next()
    step_cpu_s_per_batch: float | None  # the CPU the training process used in the step, per batch
    io_s_per_batch: float | None  # a loader's wall time per batch beyond its CPU
    step_s: float | None
    receive_s_per_batch: float | None  # the training process's CPU in next() taking in a batch from workers
    steady_batches_per_s: float | None  # the limit within an epoch, its boundaries aside
    epoch_batches: int | None  # the epoch's length the limit counts its boundary over; None: a stream
    epoch_boundary_s: float  # what each epoch's boundary costs at least (see the module's docstring)
    usable_cores: float  # this process's share of them: the usable cores over the job's local ranks
    unknown: dict[str, str]  # part -> why it could not be measured

    def to_dict(self) -> dict[str, Any]:
        def r(value: float | None, digits: int = 4) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "batches_per_s": r(self.batches_per_s, 3),
            "binds": self.binds,
            "loading_cpu_batches_per_s": r(self.loading_cpu_batches_per_s, 3),
            "loading_io_batches_per_s": r(self.loading_io_batches_per_s, 3),
            "step_batches_per_s": r(self.step_batches_per_s, 3),
            "cpu_ms_per_batch": r(None if self.cpu_s_per_batch is None else self.cpu_s_per_batch * 1000, 3),
            "step_cpu_ms_per_batch": r(
                None if self.step_cpu_s_per_batch is None else self.step_cpu_s_per_batch * 1000, 3
            ),
            "io_ms_per_batch": r(None if self.io_s_per_batch is None else self.io_s_per_batch * 1000, 3),
            "step_ms": r(None if self.step_s is None else self.step_s * 1000, 3),
            "receive_ms_per_batch": r(None if self.receive_s_per_batch is None else self.receive_s_per_batch * 1000, 3),
            "steady_batches_per_s": r(self.steady_batches_per_s, 3),
            "epoch_batches": self.epoch_batches,
            "epoch_boundary_ms": r(self.epoch_boundary_s * 1000, 3),
            "usable_cores": self.usable_cores,
            "unknown": dict(self.unknown),
        }


def _loading_cpu_s(rec: Recording) -> tuple[float | None, str | None]:
    """Loading's CPU seconds per steady batch, or None and why."""
    steady = steady_batches(rec)
    if not steady:
        return None, "no steady batch was measured"
    in_next = statistics.mean(b.wait_cpu_s for b in steady)
    if rec.settings.num_workers == 0:
        return in_next, None
    if rec.settings.backend == "thread":
        cpu = loading_cpu(rec)
        interval = interval_s(rec)
        per_batch = None if cpu is None or interval is None else cpu.cores * interval
    else:
        per_batch = worker_cpu_per_batch(rec)
    if per_batch is None:
        return None, "the workers' CPU was not sampled over steady running (a run too short to sample)"
    return per_batch + in_next, None


def _io_s(rec: Recording, cpu_s: float | None) -> tuple[float | None, str | None]:
    """A loader's wall time per batch beyond its CPU, or None and why: measurable only while the loop waits for
    loading (then each of W loaders takes W intervals per batch)."""
    steady = steady_batches(rec)
    if cpu_s is None or not steady:
        return None, "loading's CPU per batch is unknown"
    waited = sum(b.wait_s for b in steady)
    total = sum(b.wait_s + b.step_s for b in steady)
    if total <= 0 or waited / total < LOADING_SHOWS:
        return None, "loading kept up with the step: its waits, if any, were hidden"
    loaders = max(1, rec.settings.num_workers)
    if rec.settings.num_workers == 0:
        per_batch = statistics.mean(b.wait_s for b in steady)
    else:
        per_batch = loaders * total / len(steady)
    return max(0.0, per_batch - cpu_s), None


def _receive_s(rec: Recording) -> float | None:
    """The training process's CPU in next() per steady batch from worker processes: taking the batch in, which
    runs between two steps whatever the loaders do. None without worker processes (next() loads then)."""
    steady = steady_batches(rec)
    if not steady or not rec.settings.num_workers or rec.settings.backend != "process":
        return None
    return statistics.mean(b.wait_cpu_s for b in steady)


def _first_batch_s(rec: Recording, cpu_s: float | None, io_s: float | None) -> float | None:
    """One batch's loading from an idle pipeline: an epoch's first batch when its workers were already running
    (the median of those, as a loop of whole epochs pays them), else loading's CPU and waits per batch; None when
    neither is known."""
    warm = [
        first_batch_as_a_loop_pays_s(previous, epoch)
        for previous, epoch in itertools.pairwise(rec.epochs)
        if epoch.worker_pids and epoch.worker_pids == previous.worker_pids and epoch.first_batch_s is not None
    ]
    if warm:
        return statistics.median(warm)
    return None if cpu_s is None else cpu_s + (io_s or 0.0)


def host_limit(rec: Recording) -> Limit:
    """The limit of `rec`'s loader and step on its host (see the module's docstring)."""
    unknown: dict[str, str] = {}
    usable = rec.host.usable_cores / max(1, rec.host.local_ranks)
    cpu_s, why = _loading_cpu_s(rec)
    if why:
        unknown["loading-cpu"] = why
    step_cpu = main_step_cpu_s(rec) if cpu_s is not None else None
    cpu_rate = None
    if cpu_s is not None and cpu_s + (step_cpu or 0.0) > 0:
        cpu_rate = usable / (cpu_s + (step_cpu or 0.0))
    io_s, why = _io_s(rec, cpu_s)
    io_rate = None
    if why:
        unknown["loading-io"] = why
    elif io_s is not None and cpu_s is not None and io_s >= MIN_IO_SHARE * (io_s + cpu_s):
        io_rate = MAX_IO_WORKERS / (io_s + cpu_s)
    steady_ones = steady_batches(rec)
    # The step as it runs when its thread has a core: time it was descheduled (other processes, or this loader's
    # own workers, held the cores) is the machine's, and a limit read from it would blame the step for loading.
    step_s = (
        statistics.mean(b.step_s - (b.step_run_delay_s or 0.0) for b in steady_ones)
        if steady_ones and rec.step_s is not None
        else None
    )
    receive_s = _receive_s(rec)
    step_rate = 1.0 / (step_s + (receive_s or 0.0)) if step_s else None
    if step_rate is None:
        unknown["step"] = "no training step" if rec.step_s is None else "the step took no measurable time"
    parts = {"loading-cpu": cpu_rate, "loading-io": io_rate, "step": step_rate}
    known = {name: rate for name, rate in parts.items() if rate is not None}
    binds = min(known, key=lambda name: known[name]) if known else None
    steady = known[binds] if binds else None
    batches = epoch_batches(rec)
    boundary = 0.0
    if steady:
        # An epoch from iter() on: its first batch after one loader's time, the others each a steady interval
        # apart, then the last step: batches / steady + (first batch - interval + last step).
        boundary = max(0.0, (_first_batch_s(rec, cpu_s, io_s) or 0.0) - 1.0 / steady + (step_s or 0.0))
    per_epoch = steady
    if steady is not None and batches and boundary > 0:
        per_epoch = batches / (batches / steady + boundary)
    return Limit(
        batches_per_s=per_epoch,
        binds=binds,
        loading_cpu_batches_per_s=cpu_rate,
        loading_io_batches_per_s=io_rate,
        step_batches_per_s=step_rate,
        cpu_s_per_batch=cpu_s,
        step_cpu_s_per_batch=step_cpu,
        io_s_per_batch=io_s,
        step_s=step_s,
        receive_s_per_batch=receive_s,
        steady_batches_per_s=steady,
        epoch_batches=batches,
        epoch_boundary_s=boundary,
        usable_cores=usable,
        unknown=unknown,
    )


def share_of_limit(rate: float | None, limit: Limit) -> float | None:
    """`rate` as a share of the limit; None when either is unknown."""
    if rate is None or not limit.batches_per_s:
        return None
    return rate / limit.batches_per_s


def reaches_limit(share: float) -> bool:
    """Whether a rate at this share of the limit is at the limit, in words: the limit is computed from the same
    run's sampled CPU and waits, so a measured rate can pass it by their noise (a few percent); shown as 105%, that
    would claim a rate the host cannot give. The JSON keeps the share as measured."""
    return round(share, 2) >= 1.0


_BINDS_WORDS = {
    "loading-cpu": "loading's CPU binds ({cpu:.0f} ms of CPU per batch on {cores:g} cores)",
    "loading-io": "loading's waits bind ({io:.0f} ms per batch beyond its CPU, {workers} workers overlapping them)",
    "step": "the step binds ({step:.1f} ms per batch{receive})",
}


def limit_words(limit: Limit, rate: float | None, fixed_rate: float | None = None) -> str:
    """'40% of this host's limit of 39 batches/s: loading's CPU binds (52 ms of CPU per batch on 2 cores); the
    fix reaches 95%' ('at this host's limit ...' and 'the fix reaches it' from 100% on: see reaches_limit), or why
    the limit is unknown."""
    if limit.batches_per_s is None or limit.binds is None:
        reasons = "; ".join(f"{part}: {why}" for part, why in limit.unknown.items())
        return f"unknown ({reasons})"
    binds = _BINDS_WORDS[limit.binds].format(
        cpu=(limit.cpu_s_per_batch or 0.0) * 1000,
        cores=limit.usable_cores,
        io=(limit.io_s_per_batch or 0.0) * 1000,
        workers=MAX_IO_WORKERS,
        step=(limit.step_s or 0.0) * 1000,
        receive=(
            f", and {limit.receive_s_per_batch * 1000:.1f} ms in next() taking each batch in"
            if limit.receive_s_per_batch
            else ""
        ),
    )
    share = share_of_limit(rate, limit)
    # Without loading's CPU, what is known (the step) only bounds the limit from above: loading may bind lower.
    upper = "loading-cpu" in limit.unknown
    if upper:
        binds = binds.replace(" binds (", " allows no more (", 1).replace(" bind (", " allow no more (", 1)
    text = f"this host's limit of {'at most ' if upper else ''}{limit.batches_per_s:.1f} batches/s: {binds}"
    if upper:
        text += f" (loading's part is not known, so the limit may be lower: {limit.unknown['loading-cpu']})"
    if limit.steady_batches_per_s and limit.batches_per_s < limit.steady_batches_per_s:
        text += (
            f", {limit.steady_batches_per_s:.1f} within an epoch, less each epoch's end"
            f" ({limit.epoch_boundary_s * 1000:.0f} ms over {limit.epoch_batches} batches)"
        )
    if share is None:
        text = f"no rate measured against {text}"
    else:
        text = f"at {text}" if reaches_limit(share) else f"{share:.0%} of {text}"
    fixed = share_of_limit(fixed_rate, limit)
    if fixed is not None:
        text += "; the fix reaches it" if reaches_limit(fixed) else f"; the fix reaches {fixed:.0%}"
    return text
