"""tune(): search each loader of a target for its fastest safe settings, within a time and a memory budget."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import psutil

from loaderdoctor.errors import StoppedByUser, UsageError
from loaderdoctor.host.facts import host_facts
from loaderdoctor.loader.settings import LoaderSpec
from loaderdoctor.loader.threads import threads_available
from loaderdoctor.plain.words import plural
from loaderdoctor.probe.budget import check_budget, target_limit_s
from loaderdoctor.probe.measuring import Measuring, ProbeProgress
from loaderdoctor.probe.userstate import user_state_kept
from loaderdoctor.recording.forksafety import safe_start_method
from loaderdoctor.recording.record import Recording, mean_batch_bytes
from loaderdoctor.tap.watchdog import StallPolicy
from loaderdoctor.targets import resolve as targets
from loaderdoctor.tune.measure import probe_measure
from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.strategy import Search
from loaderdoctor.tune.trial import Measurement

# progress(loader name, the settings measured in words, the probe's figures so far)
TuneProgress = Callable[[str, str, ProbeProgress], None]

DEFAULT_BUDGET_S = 120.0
# A trial gets this share of a loader's budget, within the bounds below: enough for a full search with
# close calls measured again, and each trial long enough to span a few epochs of a small dataset.
_TRIALS_PER_BUDGET = 16
_QUICK_TRIALS_PER_BUDGET = 8
MIN_TRIAL_S = 1.5
MAX_TRIAL_S = 10.0
MAX_WORKERS = 64
_FDS_PER_WORKER = 16  # pipes, queues, and the shared-memory files of its batches in flight
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str | int) -> int:
    """Bytes from a size such as 8G, 512M, 1.5GiB or a plain number of bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        match = _SIZE.match(str(text))
        if match is None:
            raise UsageError(f"cannot read {text!r} as a size", hint="write it like 8G, 512M, 1.5GiB or 1000000")
        size = int(float(match["number"]) * _UNITS[match["unit"].lower()])
    if size <= 0:
        raise UsageError(f"a memory budget must be more than 0 bytes, not {text!r}")
    return size


def default_memory_budget() -> int:
    """Half of the memory available now."""
    return psutil.virtual_memory().available // 2


def trial_seconds(budget_s: float, *, quick: bool = False) -> float:
    share = budget_s / (_QUICK_TRIALS_PER_BUDGET if quick else _TRIALS_PER_BUDGET)
    return min(MAX_TRIAL_S, max(MIN_TRIAL_S, share))


def limits_for(spec: LoaderSpec, rec: Recording | None, memory_bytes: int, max_workers: int | None) -> Limits:
    """What the search may use for this loader, from the host and the baseline's run (`rec`, when it ran)."""
    host = rec.host if rec is not None else host_facts()
    start_method = spec.settings.start_method
    if rec is not None:
        # Forking into what runs in the parent could hang a worker: forkserver, where it can load this loader.
        start_method = safe_start_method(rec, spec.settings.replace(num_workers=max(1, spec.settings.num_workers)))
    ceiling = max_workers if max_workers is not None else MAX_WORKERS
    if host.fd_soft_limit is not None and host.open_fds is not None:
        ceiling = min(ceiling, max(1, (host.fd_soft_limit - host.open_fds) // _FDS_PER_WORKER))
    return Limits(
        cores=host.usable_cores / max(1, host.local_ranks),
        memory_bytes=memory_bytes,
        shm_bytes=host.shm_free_bytes,
        max_workers=ceiling,
        start_method=start_method,
        pin_memory=host.accelerator is not None,
        threads=threads_available() and not spec.is_iterable,
    )


def tune_loader(
    name: str,
    measuring: Measuring,
    *,
    budget_s: float,
    memory_bytes: int,
    quick: bool = False,
    max_workers: int | None = None,
    progress: TuneProgress | None = None,
    clock: Callable[[], float] = time.monotonic,
    baseline: tuple[Recording, Measurement] | None = None,
) -> LoaderTuning:
    """Search the settings of the loader `measuring` runs within `budget_s` seconds (by `clock`); its own
    settings are the baseline (measured first, unless `baseline` gives its recording and measurement already).
    Each trial's figures go to `progress` with the loader's name and the trial's settings when given, else to
    the measuring's own progress."""
    spec, step = measuring.spec, measuring.step
    trial_s = trial_seconds(budget_s, quick=quick)
    recordings: list[Recording] = []

    on_probe = None if progress is None else (lambda settings, figures: progress(name, settings.describe(), figures))
    measure = probe_measure(measuring, progress=on_probe, recordings=recordings)
    started = clock()
    if baseline is not None:
        recordings.append(baseline[0])
        first = baseline[1]
    else:
        first = measure(spec.settings, trial_s)
    baseline_rec = recordings[0] if recordings else None
    limits = limits_for(spec, baseline_rec, memory_bytes, max_workers)
    search = Search(
        measure,
        spec.settings,
        limits,
        budget_s=budget_s - (clock() - started),
        trial_s=trial_s,
        batch_bytes=None if baseline_rec is None or not baseline_rec.batches else int(mean_batch_bytes(baseline_rec)),
        keep_up=step is not None,
        quick=quick,
        clock=clock,
        baseline_run=first,
    )
    try:
        result = search.run()
    except KeyboardInterrupt:
        result = search.so_far()  # every trial's workers have ended (see probe())
        if result is None:
            raise
    steps = [rec.step_s for rec in recordings if rec.step_s is not None]
    tuning = LoaderTuning(
        name=name,
        trials=result.trials,
        baseline=result.baseline,
        chosen=result.chosen,
        limits=limits,
        seconds=clock() - started,
        stopped=result.stopped,
        step_ms=statistics.median(steps) * 1000 if steps else None,
        loader_class=baseline_rec.loader_class if baseline_rec is not None else "",
    )
    if result.stopped == "interrupted":
        raise StoppedByUser(tuning)
    return tuning


def tune(
    target_or_loader: Any,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    memory_budget: int | str | None = None,
    step_ms: float | None = None,
    quick: bool = False,
    max_workers: int | None = None,
    policy: StallPolicy | None = None,
    progress: TuneProgress | None = None,
) -> TuneReport:
    """Search the fastest safe settings of every loader of `target_or_loader` (a TARGET string, a DataLoader,
    a dict of them or a Workload), each tuned on its own, within about `budget_s` seconds in all.

    `memory_budget` (bytes, or a size like "8G"; default: half the memory available) bounds loading's
    measured memory: its workers plus its batches in flight. With a training step (`step_ms`, or the
    Workload's) the cheapest settings that keep up with it are chosen, not the fastest. The loaders are left
    as they were found: their generators and the global random states are restored afterwards.
    """
    check_budget(budget_s, step_ms)
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int)):
        raise UsageError(f"max_workers must be a whole number, not {max_workers!r}")
    if max_workers is not None and max_workers < 1:
        raise UsageError(f"max_workers must be 1 or more, not {max_workers}")
    memory_bytes = default_memory_budget() if memory_budget is None else parse_size(memory_budget)
    resolved = targets.resolve_any(target_or_loader, "tune", target_limit_s(budget_s))
    try:
        step = resolved.workload.training_step(step_ms)
        policy = policy or StallPolicy()
        per_loader_s = budget_s / len(resolved.loaders)
        least_s = 3 * MIN_TRIAL_S * len(resolved.loaders)
        if per_loader_s < 3 * MIN_TRIAL_S:
            raise UsageError(
                f"a budget of {budget_s:g} s is too small to tune {plural(len(resolved.loaders), 'loader')}",
                hint=f"give at least {least_s:g} s (--budget); {DEFAULT_BUDGET_S:g} s or more finds better settings",
            )
        tunings: dict[str, LoaderTuning] = {}
        with user_state_kept(resolved.loaders.values()):
            for name, loader in resolved.loaders.items():
                try:
                    tunings[name] = tune_loader(
                        name,
                        Measuring(LoaderSpec.from_loader(loader), step=step, policy=policy),
                        budget_s=per_loader_s,
                        memory_bytes=memory_bytes,
                        quick=quick,
                        max_workers=max_workers,
                        progress=progress,
                    )
                except KeyboardInterrupt as stop:
                    if isinstance(getattr(stop, "partial", None), LoaderTuning):
                        tunings[name] = stop.partial
                    raise StoppedByUser(TuneReport(resolved.target, tunings)) from None
        return TuneReport(resolved.target, tunings)
    finally:
        resolved.close()
