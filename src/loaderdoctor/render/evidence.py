"""A finding's evidence in words for the console ("wait per batch 12.3 ms, workers 4"), from one table of labels
and units; the JSON keeps the evidence's keys and values as the rules wrote them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# How each value is said: a share of 0..1 as a percentage, a figure with its unit, or as it is ("").
_SHARE = "share"
_UNITS_CLOSE = ("x", "%")  # written against the figure: "1.5x", "150%"
_SINGULAR = {"cores": "core", "samples": "sample"}

# The label and unit of each key the rules (and scale's and the history's findings) write, said as "label value
# unit". A key not here is said by its name, its unit read from its ending (_ms, _s, _mb, _share, _fraction).
LABELS: dict[str, tuple[str, str]] = {
    # time spent waiting, and the step
    "wait_fraction": ("waiting for data", _SHARE),
    "wait_ms_mean": ("wait per batch", "ms"),
    "wait_ms_p50": ("median wait per batch", "ms"),
    "wait_ms": ("wait per batch", "ms"),
    "wait_ms_by_rank": ("wait per batch by rank", "ms"),
    "wait_descheduled_ms_mean": ("descheduled per wait", "ms"),
    "others_median_wait_ms": ("the other ranks' median wait", "ms"),
    "others_median_step_ms": ("the other ranks' median step", "ms"),
    "step_ms": ("training step", "ms"),
    "share_of_run": ("share of the run", _SHARE),
    "share_of_interval": ("share of the interval", _SHARE),
    "share_of_others_step": ("the other ranks' step spent waiting", _SHARE),
    "waiting_share": ("waiting on the lock", _SHARE),
    "estimated_run_share": ("estimated share of the run", _SHARE),
    # the ceiling: the loop with its input taken away (run --ceiling)
    "real_batches_per_s": ("real rate in its turns", "batches/s"),
    "ceiling_batches_per_s": ("with the input taken away", "batches/s"),
    "ceiling_speedup": ("faster with a perfect input", "x"),
    "measured_input_cost": ("measured cost of the input", _SHARE),
    "wait_model_input_cost": ("its cost as the waits say", _SHARE),
    "data_free_steps": ("steps on repeated batches", ""),
    "turn_speedups": ("data-free turns against the real ones beside them", "x"),
    "input_cost_by_rank": ("measured cost of the input by rank", _SHARE),
    "ranks_measured": ("ranks measured", ""),
    "batches_left_unasked": ("batches of its epochs never asked for", ""),
    # settings and processes
    "num_workers": ("workers", ""),
    "workers": ("workers", ""),
    "worker_processes": ("worker processes", ""),
    "prefetch_factor": ("prefetch factor", ""),
    "pin_memory": ("pinned memory", ""),
    "start_method": ("start method", ""),
    "settings": ("settings", ""),
    "sharing_strategy": ("sharing strategy", ""),
    "threads_per_worker": ("threads per worker", ""),
    "busy_threads_per_worker": ("busy threads per worker", ""),
    "pool_cores_per_worker": ("a worker's other threads used", "cores"),
    "threads": ("threads", ""),
    "native_threads": ("native threads", ""),
    "pids": ("pids", ""),
    "pid": ("pid", ""),
    "programs": ("programs", ""),
    # cores and CPU
    "loading_cores": ("loading used", "cores"),
    "available_cores": ("available to loading", "cores"),
    "usable_cores": ("usable", "cores"),
    "affinity_cores": ("affinity mask", "cores"),
    "cgroup_cpu_quota": ("cgroup CPU quota", "cores"),
    "loading_cpu_share": ("loading's share of those cores", _SHARE),
    "cores_busy_share": ("machine's cores busy", _SHARE),
    "cpu_percent": ("CPU", "%"),
    "run_delay_share": ("ready but descheduled", _SHARE),
    "compute_share": ("computing rather than waiting", _SHARE),
    "site_cpu_share": ("CPU at the lock's site", _SHARE),
    "workers_idle_share": ("workers idle", _SHARE),
    "workers_cpu_idle": ("workers' CPU idle", ""),
    "local_ranks": ("ranks on this machine", ""),
    # start-up
    "first_batch_s": ("first batch per epoch", "s"),
    "respawn_s_per_epoch": ("workers' start per epoch", "s"),
    "respawn_share_of_epoch": ("epoch's share starting workers", _SHARE),
    "startup_fraction": ("share spent starting", _SHARE),
    "pickled_dataset_mb": ("pickled dataset", "MB"),
    "epochs": ("epochs", ""),
    # memory and shared memory
    "uss_start_mb": ("private memory at start", "MB"),
    "uss_end_mb": ("private memory at end", "MB"),
    "uss_mb": ("private memory", "MB"),
    "rss_mb": ("resident memory", "MB"),
    "total_mb": ("in all", "MB"),
    "growth_mb_per_worker": ("growth per worker", "MB"),
    "growth_mb_per_min": ("growth per minute", "MB"),
    "still_rising": ("still rising", ""),
    "seconds": ("over", "s"),
    "batch_mb": ("batch", "MB"),
    "accelerator": ("accelerator", ""),
    "shm_total_mb": ("shared memory size", "MB"),
    "shm_free_mb": ("shared memory free", "MB"),
    "shm_in_flight_mb": ("shared memory in flight", "MB"),
    "open_fds": ("open files", ""),
    "fd_soft_limit": ("open-file limit", ""),
    "fds_in_flight_estimate": ("files in flight, estimated", ""),
    # crashes, stalls and fork hazards
    "deaths": ("deaths", ""),
    "worker_deaths": ("worker deaths", ""),
    "restarts": ("restarts", ""),
    "epoch": ("epoch", ""),
    "batch": ("batch", ""),
    "index": ("sample index", ""),
    "exitcode": ("exit code", ""),
    "signal": ("signal", ""),
    "oom_kill": ("killed for memory", ""),
    "worker_init_error": ("worker_init_fn error", ""),
    "stalled": ("stalled", ""),
    "waited_s": ("waited", "s"),
    "threshold_s": ("stall threshold", "s"),
    "reason": ("reason", ""),
    "stuck_frames": ("stuck at", ""),
    "cuda_initialized": ("CUDA initialised", ""),
    "compiled_frames": ("compiled frames", ""),
    "compile_workers": ("compile workers", ""),
    "forkserver_blocker": ("forkserver blocked by", ""),
    # data
    "count": ("errors", ""),
    "fraction": ("share failed", _SHARE),
    "indices": ("sample indices", ""),
    "error_types": ("error types", ""),
    "first_message": ("first message", ""),
    "samples_seen": ("samples seen", ""),
    "distinct_samples": ("distinct samples", ""),
    "copies_of_each_sample": ("copies of each sample", ""),
    "epoch_batches": ("batches in an epoch", ""),
    "expected_batches": ("batches expected", ""),
    # ranks and samplers
    "world_size": ("ranks", ""),
    "ranks": ("found on ranks", ""),
    "rank": ("rank", ""),
    "host": ("host", ""),
    "hosts": ("hosts", ""),
    "rank_findings": ("the rank's findings", ""),
    "efficiency": ("scaling efficiency", ""),
    "iterable": ("iterable dataset", ""),
    "sampler": ("sampler", ""),
    "sampler_epoch": ("sampler's epoch", ""),
    "dataset_len": ("dataset", "samples"),
    "samples_per_rank": ("samples per rank", ""),
    "samples_compared": ("samples compared", ""),
    "indices_compared": ("indices compared", ""),
    "shared_samples_share": ("samples another rank also loads", _SHARE),
    "batches_per_epoch": ("batches per epoch", ""),
    # locks
    "site": ("site", ""),
    "lock": ("lock", ""),
    "read_only_lock_calls": ("lock calls on read-only files", ""),
    "exclusive_read_only_lock_calls": ("exclusive ones", ""),
    "writable_lock_calls": ("lock calls on writable files", ""),
    # the history's degradation
    "rate": ("rate", ""),
    "baseline_rate": ("baseline rate", ""),
    "ratio": ("ratio to the baseline", "x"),
    "unit": ("unit", ""),
    "same_settings": ("same settings", ""),
    "compared_runs": ("runs compared", ""),
    "changes": ("changes", ""),
    "likeliest_cause": ("likeliest cause", ""),
    "named_processes": ("processes named", ""),
}

# A key's unit read from its ending, for keys the table does not know (a newer rule's, or scale's
# "waiting_share_at_2_ranks").
_ENDINGS = (("_ms", "ms"), ("_s", "s"), ("_mb", "MB"), ("_share", _SHARE), ("_fraction", _SHARE))
_SHARE_WORD = re.compile(r"(^|_)(share|fraction)(_|$)")


def _run_words(run: dict[str, Any]) -> str:
    """'run 10 of 2026-05-01 10:10 at 20.8'."""
    started = str(run.get("started_at") or "")[:16].replace("T", " ")
    return f"run {run.get('id')}{f' of {started}' if started else ''} at {value_words(run.get('rate'), '')}"


def _process_words(process: dict[str, Any]) -> str:
    """'pid 4242 python (0.97 cores, another user's)'."""
    program = str(process.get("cmdline") or "")
    owner = {True: ", yours", False: ", another user's"}.get(process.get("same_user"), "")
    stray = ", a stray worker" if process.get("stray") else ""
    return f"pid {process.get('pid')}{f' {program}' if program else ''} ({process.get('cores')} cores{owner}{stray})"


# Keys whose values are lists of records (the history's degradation): each record said in a few words, as the
# JSON keeps it whole.
_RECORDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "compared_runs": _run_words,
    "changes": lambda change: str(change.get("words") or change.get("what")),
    "named_processes": _process_words,
}
_RECORDS_SHOWN = 6


def _records_words(key: str, value: Any) -> str | None:
    """A list of records in words, where `key` is one of _RECORDS; None otherwise."""
    said = _RECORDS.get(key)
    if said is None or not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        return None
    if not value:
        return "none"
    more = f"; … {len(value) - _RECORDS_SHOWN} more" if len(value) > _RECORDS_SHOWN else ""
    return "; ".join(said(item) for item in value[:_RECORDS_SHOWN]) + more


def evidence_words(evidence: dict[str, Any]) -> str:
    """The evidence as the console says it: 'waiting for data 63%, wait per batch 113 ms, workers 0'."""
    return ", ".join(item_words(key, value) for key, value in evidence.items())


def item_words(key: str, value: Any) -> str:
    """One piece of evidence: its label, its value, its unit."""
    label, unit = LABELS.get(key) or _guessed(key)
    records = _records_words(key, value)
    return f"{label} {records if records is not None else value_words(value, unit)}"


def _guessed(key: str) -> tuple[str, str]:
    """A key's label and unit when the table has none: its words, and its unit from its ending."""
    for ending, unit in _ENDINGS:
        if key.endswith(ending):
            return humanised(key.removesuffix(ending)), unit
    if _SHARE_WORD.search(key):
        return humanised(key), _SHARE
    return humanised(key), ""


def humanised(key: str) -> str:
    """A key in words: 'shm_free' -> 'shm free'."""
    return " ".join(key.split("_")).strip() or key


def value_words(value: Any, unit: str) -> str:
    """A value in words with its unit: a share as a percentage, yes or no, a list or a mapping in short."""
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return "; ".join(f"{key}: {value_words(item, unit)}" for key, item in value.items()) or "none"
    if isinstance(value, list):
        if not value:
            return "none"
        shown = [value_words(item, _SHARE if unit == _SHARE else "") for item in value[:6]]
        more = f", … {len(value) - 6} more" if len(value) > 6 else ""
        return ", ".join(shown) + more + (f" {unit}" if unit and unit != _SHARE else "")
    if isinstance(value, (int, float)) and unit == _SHARE:
        return f"{value * 100:.3g}%"
    text = f"{value:.3g}" if isinstance(value, float) else str(value)
    if unit in _UNITS_CLOSE:
        return text + unit
    if value == 1 and unit in _SINGULAR:
        return f"{text} {_SINGULAR[unit]}"
    return f"{text} {unit}" if unit else text
