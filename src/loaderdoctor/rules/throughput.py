"""Rules about time the training loop loses waiting for batches: in steady state, and at each epoch's start."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from loaderdoctor.plain.numbers import MIB, rounded
from loaderdoctor.plain.words import percent, plural
from loaderdoctor.recording.forksafety import recorded_hazards
from loaderdoctor.recording.record import (
    NOTABLE_DESCHEDULED_WAIT_S,
    Recording,
    descheduled_wait_s,
    startup_s,
    wait_fraction,
)
from loaderdoctor.recording.usage import BUSY_OTHER_CORES, LoadingCpu, loading_cpu
from loaderdoctor.rules._common import (
    COMPUTING_SHARE,
    WAITING_SHARE,
    mb,
    settings_snippet,
    steady_batches,
    steady_interval_s,
)
from loaderdoctor.rules.finding import CRITICAL_TIME_SHARE, WARNING_TIME_SHARE, Finding, time_cost_severity

# Workers that wait on I/O: more of them than cores helps, up to a point where memory and open files cost
# more than the extra reads in flight gain.
MAX_IO_WORKERS = 16
IO_HEADROOM = 1.25
# Loaders ready to run but kept off the cores this share of their time or more: said in the fix's words.
DESCHEDULED_SHARE = 0.1

# A later epoch's first batch this many times slower than a steady batch means workers were started again.
RESPAWN_FIRST_BATCH_RATIO = 3.0
# A restart this quick (fork starts workers in tens of milliseconds) is not worth a user's attention, whatever
# its share of a short measurement: without a training step, the measured epochs are loading alone.
MIN_RESPAWN_S = 0.1

# Slow start: a first batch this slow, caused by this much pickled dataset sent to the workers in all.
SLOW_FIRST_BATCH_S = 1.0
LARGE_PICKLED_TOTAL_BYTES = 32 * MIB
SLOW_START_METHODS = ("spawn", "forkserver")

LEAN_GETSTATE_SNIPPET = """\
class MyDataset(torch.utils.data.Dataset):
    def __init__(self, path):
        self.path = path
        self._data = None  # opened lazily, once in each worker

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_data"] = None  # workers get the path, not the contents
        return state

    def __getitem__(self, index):
        if self._data is None:
            self._data = np.load(self.path, mmap_mode="r")
        return self._data[index]"""


def _workers_to_fill(workers: int, fraction: float, cpu: LoadingCpu) -> int:
    """Workers enough to keep up with the step when loading waits more than it computes: batches now come at
    step/(1 - wait fraction), so that many times the loaders must be in flight (with a quarter's headroom),
    as long as their CPU together still fits the cores available."""
    loaders = max(workers, 1)
    needed = math.ceil(round(loaders / (1.0 - fraction) * IO_HEADROOM, 6)) if fraction < 1 else MAX_IO_WORKERS
    suggested = max(needed, 2 * round(cpu.own_cores), 4)
    if cpu.per_loader > 0:
        suggested = min(suggested, max(math.floor(cpu.own_cores / cpu.per_loader + 1e-9), 1))
    return min(MAX_IO_WORKERS, suggested)


def _cpu_words(cpu: LoadingCpu, workers: int) -> str:
    """What loading's CPU was, in the numbers that decide the fix: 'its 4 workers kept 1.9 of the 2
    available cores busy'."""
    who = "the main process" if workers == 0 else f"its {plural(workers, 'worker')}"
    words = f"{who} kept {cpu.cores:.1f} of the {cpu.available_cores:.1f} available cores busy"
    if round(cpu.cores, 1) >= round(cpu.available_cores, 1):  # sampling noise can put it past them: at most all
        words = f"{who} kept all {cpu.available_cores:.1f} available cores busy"
    delayed = cpu.run_delay_share
    if delayed is not None and delayed >= DESCHEDULED_SHARE:
        words += f", ready to run but descheduled {percent(delayed)} of the time"
    if cpu.other_cores is not None and cpu.other_cores >= BUSY_OTHER_CORES:
        words += f" while other processes took {cpu.other_cores:.1f}"
    return words


def _worker_per_core(cores: int, why: str) -> tuple[dict[str, Any], str]:
    change = {"num_workers": cores, "persistent_workers": True}
    return change, (
        f"{why}: use {plural(cores, 'worker')}, one per core, so batches are prepared while the step runs, and keep "
        "them alive between epochs."
    )


def _loading_fix(rec: Recording, fraction: float, cpu: LoadingCpu | None) -> tuple[dict[str, Any], str]:
    """The settings change and the words for input-bound loading, following what loading's CPU shows."""
    workers = rec.settings.num_workers
    cores = max(1, round(cpu.own_cores if cpu is not None else rec.host.usable_cores))
    where = "in the main process, between training steps" if workers == 0 else f"in {plural(workers, 'worker')}"
    if cpu is None:
        if workers < cores:
            return _worker_per_core(cores, f"Loading runs {where}; whether it computes or waits could not be measured")
        return {}, (
            f"Loading runs {where}, and whether it computes or waits could not be measured: run "
            "`loaderdoctor tune` to measure other worker counts."
        )
    # Workers that keep up idle between batches: only saturated loading (the step waits most of the time, or
    # loading runs in the main process) shows in its CPU whether it computes or waits.
    saturated = workers == 0 or fraction > CRITICAL_TIME_SHARE
    if cpu.compute_share >= COMPUTING_SHARE:
        if workers < cores:
            return _worker_per_core(cores, f"Loading computes ({_cpu_words(cpu, workers)}) {where}")
        return {}, (
            f"Loading is CPU-bound: {_cpu_words(cpu, workers)}, so more workers cannot help: make each "
            "sample cheaper (decode once and cache, smaller images), use threads for work that releases the GIL, "
            "or move augmentation to the accelerator."
        )
    if cpu.compute_share < WAITING_SHARE and saturated:
        suggested = _workers_to_fill(workers, fraction, cpu)
        if suggested > workers:
            change = {"num_workers": suggested, "persistent_workers": True}
            return change, (
                f"Loading waits more than it computes ({_cpu_words(cpu, workers)}, "
                f"{percent(cpu.share)} of what it could): more workers than cores overlap the waits; use "
                f"{plural(suggested, 'worker')} to keep more reads in flight, and keep them alive between epochs."
            )
        return {}, (
            f"Loading waits more than it computes even with {plural(workers, 'worker')} ({_cpu_words(cpu, workers)}): "
            "read less per sample (smaller or pre-decoded files), read faster storage, or cache the data locally."
        )
    if workers < cores:
        return _worker_per_core(cores, f"Loading runs {where} ({_cpu_words(cpu, workers)})")
    return {}, (
        f"Loading nearly keeps up ({_cpu_words(cpu, workers)}); whether more "
        "workers would help cannot be told from its CPU: run `loaderdoctor tune` to measure them."
    )


def _contention_evidence(rec: Recording, cpu: LoadingCpu | None) -> dict[str, Any]:
    """Where the kernel counts it, the share of its loaders' time loading was ready but descheduled and the
    share that decided the fix with it (see LoadingCpu.compute_share); the node's ranks, where several share
    its cores (available_cores is then this rank's part)."""
    evidence: dict[str, Any] = {}
    if cpu is not None and cpu.run_delay_share is not None:
        evidence["run_delay_share"] = round(cpu.run_delay_share, 3)
        evidence["compute_share"] = round(cpu.compute_share, 3)
    if rec.host.local_ranks > 1:
        evidence["local_ranks"] = rec.host.local_ranks
    return evidence


# A loader whose epochs were open for less than this share of the run (a validation loader between training
# epochs) costs the run its waits times that share: its severity is weighed by it.
PART_OF_THE_RUN = 0.75


def share_of_run(rec: Recording) -> float:
    """The share of the run the loader's epochs were open (iter() to their end): about 1 for a loader measured
    alone or the training loader, small for a validation loader run between training epochs."""
    if rec.wall_s <= 0 or not rec.epochs:
        return 1.0
    return min(1.0, sum(e.wall_s for e in rec.epochs) / rec.wall_s)


def input_bound(rec: Recording) -> Finding | None:
    """The training step waits for data: how long, and the change the measured CPU of loading calls for;
    weighed by the loader's share of the run when it ran for a part of it only (see PART_OF_THE_RUN)."""
    fraction = wait_fraction(rec)
    if fraction is None or rec.step_s is None:
        return None
    share = share_of_run(rec)
    weight = share if share < PART_OF_THE_RUN else 1.0
    # Measured with the input taken away (`run --ceiling`), the input's cost is known, not read from the waits.
    measured = rec.ceiling.input_cost if rec.ceiling is not None else None
    cost = fraction if measured is None else measured
    severity = time_cost_severity(cost * weight)
    if severity is None:
        return None
    cpu = loading_cpu(rec)
    change, fix = _loading_fix(rec, fraction, cpu)
    waits = [b.wait_s for b in steady_batches(rec)]
    descheduled = descheduled_wait_s(rec)
    return Finding(
        rule="input-bound",
        severity=severity,
        title=f"The training step waits for data {percent(fraction)} of the time"
        + (f" of this loader's epochs, which took {percent(share)} of the run" if weight < 1.0 else ""),
        evidence={
            "wait_fraction": round(fraction, 3),
            "wait_ms_mean": round(statistics.mean(waits) * 1000, 2),
            "wait_ms_p50": round(statistics.median(waits) * 1000, 2),
            "step_ms": round(rec.step_s * 1000, 2),
            "num_workers": rec.settings.num_workers,
            "loading_cores": None if cpu is None else round(cpu.cores, 2),
            "available_cores": None if cpu is None else round(cpu.available_cores, 2),
            "loading_cpu_share": None if cpu is None else round(cpu.share, 3),
            "usable_cores": rec.host.usable_cores,
            **_contention_evidence(rec, cpu),
            **({"share_of_run": round(share, 3)} if weight < 1.0 else {}),
            **({"measured_input_cost": round(measured, 3)} if measured is not None else {}),
            # Of the mean wait, the time the loop's own thread was descheduled (left out of wait_fraction).
            **(
                {"wait_descheduled_ms_mean": round(descheduled * 1000, 2)}
                if descheduled is not None and descheduled >= NOTABLE_DESCHEDULED_WAIT_S
                else {}
            ),
        },
        fix=fix,
        snippet=settings_snippet(rec, change),
        settings_change=change,
        impact=cost * weight,
    )


def _descheduled_startups(rec: Recording) -> dict[str, Any]:
    """The evidence of the start-ups' time descheduled (left out of the respawn cost), where it was counted."""
    delays = [e.first_batch_run_delay_s for e in rec.epochs[1:] if e.first_batch_run_delay_s is not None]
    return {"descheduled_s_per_epoch": round(statistics.mean(delays), 3)} if delays else {}


def _workers_restarted(rec: Recording) -> bool:
    """Whether the epochs show new workers: other pids, or later first batches far slower than steady ones."""
    pid_sets = [frozenset(e.worker_pids) for e in rec.epochs if e.worker_pids]
    if len(pid_sets) >= 2:
        return any(a != b for a, b in itertools.pairwise(pid_sets))
    interval = steady_interval_s(rec)
    later = [e.first_batch_s for e in rec.epochs[1:] if e.first_batch_s is not None]
    return bool(later) and interval > 0 and min(later) > RESPAWN_FIRST_BATCH_RATIO * interval


def _batches_per_epoch(rec: Recording) -> int:
    """An epoch's batches: the median of the epochs that ran to their end, else the most any epoch delivered."""
    whole = [e.batches for e in rec.epochs if e.ended == "exhausted"]
    return statistics.median_low(whole) if whole else max(e.batches for e in rec.epochs)


def worker_respawn(rec: Recording) -> Finding | None:
    """Workers are started again every epoch: the time that costs and persistent_workers as the fix."""
    settings = rec.settings
    if settings.num_workers == 0 or settings.persistent_workers or len(rec.epochs) < 2:
        return None
    if not _workers_restarted(rec):
        return None
    interval = steady_interval_s(rec)
    # The first epoch's start-up stays with persistent workers: only the later ones are saved.
    # Less the time the new workers waited for a core other processes held: the machine's load, not the loader's.
    respawns = [
        max(0.0, e.first_batch_s - (e.first_batch_run_delay_s or 0.0) - interval)
        for e in rec.epochs[1:]
        if e.first_batch_s is not None
    ]
    if not respawns:
        return None
    per_epoch_s = sum(respawns) / len(respawns)
    if per_epoch_s < MIN_RESPAWN_S:
        return None
    # The share of each epoch, not of this measurement: how many epochs a budget holds changes with the machine's
    # load (fewer beside busy processes, each diluted by the first epoch's start-up), a training run's epochs do not.
    impact = per_epoch_s / (per_epoch_s + _batches_per_epoch(rec) * interval)
    severity = time_cost_severity(impact)
    if severity is None:
        return None
    change = {"persistent_workers": True}
    return Finding(
        rule="worker-respawn",
        severity=severity,
        title=f"Workers start again every epoch: {per_epoch_s:.2f} s each time, {percent(impact)} of an epoch",
        evidence={
            "first_batch_s": [rounded(e.first_batch_s, 3) for e in rec.epochs],
            "respawn_s_per_epoch": round(per_epoch_s, 3),
            "respawn_share_of_epoch": round(impact, 3),
            **_descheduled_startups(rec),
            "start_method": rec.start_method,
            "epochs": len(rec.epochs),
        },
        fix=(
            "Set persistent_workers=True so workers start once and are reused every epoch. Caveat: with "
            "persistent workers, changes the main process makes to the dataset no longer reach the workers."
        ),
        snippet=settings_snippet(rec, change),
        settings_change=change,
        impact=impact,
    )


def slow_start(rec: Recording) -> Finding | None:
    """Spawned workers take long to start because each one unpickles a large dataset."""
    settings = rec.settings
    if (
        settings.num_workers == 0
        or rec.start_method not in SLOW_START_METHODS
        or rec.pickled_dataset_bytes is None
        or not rec.epochs
        or rec.epochs[0].first_batch_s is None
        or rec.wall_s <= 0
    ):
        return None
    first_s = rec.epochs[0].first_batch_s
    if first_s < SLOW_FIRST_BATCH_S or rec.pickled_dataset_bytes * settings.num_workers < LARGE_PICKLED_TOTAL_BYTES:
        return None
    impact = min(1.0, startup_s(rec) / rec.wall_s)
    # The size is shown evidence of a cost even when this short run spends little of its time starting.
    severity = "critical" if impact > CRITICAL_TIME_SHARE else "warning" if impact >= WARNING_TIME_SHARE else "info"
    dataset_mb = mb(rec.pickled_dataset_bytes)
    change: dict[str, Any] = {}
    fork_safe = not recorded_hazards(rec)
    if fork_safe:
        change["start_method"] = "fork"
    if not settings.persistent_workers:
        change["persistent_workers"] = True
    fix = (
        f"Each of the {settings.num_workers} workers unpickles the {dataset_mb:g} MB dataset at start-up "
        f"under {rec.start_method}: give the dataset a lean __getstate__ that leaves big data out and opens "
        "files lazily in the worker."
    )
    if fork_safe:
        fix += " Nothing alive in this process makes fork unsafe, and forked workers share the dataset instead."
    return Finding(
        rule="slow-start",
        severity=severity,
        title=f"Workers take {first_s:.1f} s to start: each unpickles a {dataset_mb:g} MB dataset",
        evidence={
            "pickled_dataset_mb": dataset_mb,
            "num_workers": settings.num_workers,
            "start_method": rec.start_method,
            "first_batch_s": [rounded(e.first_batch_s, 3) for e in rec.epochs],
            "startup_fraction": round(impact, 3),
        },
        fix=fix,
        snippet=LEAN_GETSTATE_SNIPPET,
        settings_change=change,
        impact=impact,
    )
