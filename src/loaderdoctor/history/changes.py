"""What changed between a run and the earlier runs of the same name, each change measured and ranked likeliest
cause first (history/figures.py's tiers): the checks of the training step, the settings, the data, the machine
and its load, and the wait share; the processes beside the run are history/processes.py's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loaderdoctor.history.figures import (
    CHANGED_RUN,
    HOST_LOAD,
    HOST_STATE,
    STEP,
    SYMPTOM,
    Change,
    figure,
    host_figures,
    median,
    number,
    share,
    size,
    takes_cores,
    usable_cores,
)
from loaderdoctor.history.processes import cores_taken_by_others, other_processes, stray_workers
from loaderdoctor.history.records import RunRecord
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.numbers import MIB
from loaderdoctor.plain.words import percent
from loaderdoctor.rules.finding import WARNING_TIME_SHARE

# The step counts as slower from a fifth more; the wait share as risen from 5 points more (below: noise), and
# as a change worth naming from 10 points more.
STEP_SLOWER_RATIO = 1.2
STEP_SHARE_OF_INTERVAL = 0.1
WAIT_SHARE_NOISE = 0.05
WAIT_SHARE_RISE = 0.10
MEMORY_DROP_SHARE = 0.2  # of the machine's memory
SWAP_RISE_BYTES = 256 * MIB
SHM_RISE_SHARE = 0.1  # of /dev/shm
SHM_RISE_BYTES = 64 * MIB
FDS_RISE = 64  # and at least twice as many as before


def ranked_changes(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Every measured change between `run` and the runs compared, likeliest cause first (see TAKES_CORES...)."""
    found: list[Change] = []
    for measure in _MEASURES:
        found.extend(measure(run, compared))
    return sorted(found, key=lambda change: (change.tier, -change.weight))


def _step(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """A slower training step; the likely cause when the share of time waiting on data did not rise with it."""
    now = number(run.measurements, "step_ms")
    before = median(number(r.measurements, "step_ms") for r in compared)
    if now is None or before is None or before <= 0 or now < STEP_SLOWER_RATIO * before:
        return []
    interval = number(run.measurements, "interval_ms") or now
    share = min(1.0, (now - before) / interval)
    if share < STEP_SHARE_OF_INTERVAL:
        return []
    wait_now = number(run.measurements, "wait_fraction")
    wait_before = median(number(r.measurements, "wait_fraction") for r in compared)
    held = wait_now is not None and wait_before is not None and wait_now <= wait_before + WAIT_SHARE_NOISE
    # A step on a CPU that other processes share slows with them: then the step is no cause of its own.
    others = cores_taken_by_others(run)
    contended = takes_cores(others, usable_cores(run))
    words = f"the training step took {figure(now)} ms a batch, up from {figure(before)} ms"
    if contended:
        words += f", while other processes took {others:.1f} cores (a step that computes on the CPU slows with them)"
    elif held and wait_now is not None and wait_before is not None:
        words += (
            f", and the share of time waiting on data did not rise ({percent(wait_now)}, "
            f"{percent(wait_before)} before): the slowdown is the model's step, not the input"
        )
    # "More workers will not help" only where the loop hardly waits on data now: else it contradicts input-bound.
    input_idle = wait_now is not None and wait_now < WARNING_TIME_SHARE
    if contended:
        fix = (
            f"The training step got slower ({figure(before)} -> {figure(now)} ms a batch) while other processes "
            f"took {others:.1f} cores: run where they do not, or lower their priority, and compare again."
        )
    else:
        fix = (
            f"The training step itself got slower ({figure(before)} -> {figure(now)} ms a batch)"
            + (", not the input" if held else "")
            + (": more workers will not help. " if held and input_idle else ". ")
            + "Profile the step (torch.profiler) and look at what changed in the model, its inputs' shapes, "
            "the device or the libraries."
        )
    return [
        Change(
            what="step_ms",
            before=round(before, 3),
            now=round(now, 3),
            words=words,
            fix=fix,
            tier=STEP if held and not contended else HOST_LOAD,
            weight=share,
        )
    ]


def _settings(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """The loader's settings, against the newest run compared (they differ only when none had the run's)."""
    before = compared[0].settings
    keys = [key for key in dict.fromkeys([*before, *run.settings]) if before.get(key) != run.settings.get(key)]
    if not keys:
        return []
    restore = {key: before.get(key) for key in keys}
    snippet = None
    try:
        snippet = Settings.from_dict(before).snippet(str(run.dataset.get("loader_class") or ""))
    except Exception:  # settings of another version of loaderdoctor: the words still name them
        snippet = None
    return [
        Change(
            what="settings",
            before=restore,
            now={key: run.settings.get(key) for key in keys},
            words="the settings changed: " + _key_changes(keys, before, run.settings),
            fix="Restore the settings of the earlier runs: "
            + ", ".join(f"{key}={value!r}" for key, value in restore.items())
            + ".",
            snippet=snippet,
            settings_change=restore,
            tier=CHANGED_RUN,
            weight=1.0,
        )
    ]


def _dataset(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """The data loaded (its name, length and batch size), against the newest run compared."""
    before, now = compared[0].dataset, run.dataset
    keys = [key for key in ("name", "len", "batch_size") if key in before and key in now and before[key] != now[key]]
    if not keys:
        return []
    return [
        Change(
            what="dataset",
            before={key: before[key] for key in keys},
            now={key: now[key] for key in keys},
            words="the data changed: " + _key_changes(keys, before, now),
            fix="The run loaded other data than the runs compared: compare runs over the same data, or take this "
            "run's rate as the new baseline.",
            tier=CHANGED_RUN,
            weight=0.9,
        )
    ]


def _machine(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Another machine than the newest run compared's."""
    now, before = run.host.get("hostname"), compared[0].host.get("hostname")
    if not now or not before or now == before:
        return []
    return [
        Change(
            what="hostname",
            before=before,
            now=now,
            words=f"the run ran on {now}, the run before on {before}",
            fix="The run ran on another machine: compare runs on one machine, or check this one's cores and load.",
            tier=CHANGED_RUN,
            weight=0.8,
        )
    ]


def _load_average(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """A higher load average at the run's start: work outside the run that no process named explains."""
    now, before = host_figures(run, compared, "load_avg_1m")
    usable = usable_cores(run)
    if now is None or before is None or not takes_cores(now - before, usable):
        return []
    on_cores = f" ({figure(usable)} usable cores)" if usable else ""
    return [
        Change(
            what="load_avg_1m",
            before=before,
            now=now,
            words=f"the load average was {now:.1f} at the run's start{on_cores}, up from {before:.1f}",
            fix="Something outside the run kept the cores busy at its start: find it (ps -eo pid,pcpu,args "
            "--sort=-pcpu | head) and end it or renice it.",
            tier=HOST_LOAD,
            weight=share(now - before, usable),
        )
    ]


def _memory(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Less memory available, and swap in use: the machine pages to disk."""
    changes = []
    total = number(run.host, "memory_total_bytes")
    swap_now, swap_before = host_figures(run, compared, "swap_used_bytes")
    if swap_now is not None and swap_before is not None and swap_now - swap_before >= SWAP_RISE_BYTES:
        changes.append(
            Change(
                what="swap_used_bytes",
                before=int(swap_before),
                now=int(swap_now),
                words=f"swap in use {size(swap_now)}, up from {size(swap_before)}: the machine pages to disk",
                fix="The machine is short of memory and pages to disk: end what holds memory, or lower num_workers "
                "or prefetch_factor.",
                tier=HOST_LOAD,
                weight=share(swap_now - swap_before, total),
            )
        )
    available_now, available_before = host_figures(run, compared, "memory_available_bytes")
    if available_now is None or available_before is None or not total:
        return changes
    if available_before - available_now >= MEMORY_DROP_SHARE * total:
        changes.append(
            Change(
                what="memory_available_bytes",
                before=int(available_before),
                now=int(available_now),
                words=f"memory available {size(available_now)} of {size(total)}, down from {size(available_before)}",
                fix="Other processes hold memory the earlier runs had: end them, or lower num_workers or "
                "prefetch_factor.",
                tier=HOST_LOAD,
                weight=share(available_before - available_now, total),
            )
        )
    return changes


def _shm(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """More of /dev/shm in use at the start: files that ended runs left behind, or other jobs'."""
    now, before = host_figures(run, compared, "shm_used_bytes")
    total = number(run.host, "shm_total_bytes")
    if now is None or before is None or not total:
        return []
    rise = now - before
    if rise < SHM_RISE_BYTES or rise < SHM_RISE_SHARE * total:
        return []
    return [
        Change(
            what="shm_used_bytes",
            before=int(before),
            now=int(now),
            words=f"/dev/shm held {size(now)} of {size(total)} at the start, up from {size(before)}",
            fix="/dev/shm fills up: look for what ended runs left there (ls -la /dev/shm) and remove it.",
            tier=HOST_STATE,
            weight=share(rise, total),
        )
    ]


def _open_files(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """More files open in the process at the start."""
    now, before = host_figures(run, compared, "open_fds")
    if now is None or before is None or now - before < FDS_RISE or now < 2 * before:
        return []
    limit = number(run.host, "fd_soft_limit")
    of_limit = f" (limit {limit:.0f})" if limit else ""
    return [
        Change(
            what="open_fds",
            before=int(before),
            now=int(now),
            words=f"the process had {now:.0f} files open at the start{of_limit}, up from {before:.0f}",
            fix="The process holds more open files than before: close what the script or dataset opens and never "
            "closes.",
            tier=HOST_STATE,
            weight=share(now - before, limit),
        )
    ]


def _wait_share(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """A larger share of time waiting on data: loading got slower (a symptom; the causes are above it)."""
    now = number(run.measurements, "wait_fraction")
    before = median(number(r.measurements, "wait_fraction") for r in compared)
    if now is None or before is None or now - before < WAIT_SHARE_RISE:
        return []
    return [
        Change(
            what="wait_fraction",
            before=round(before, 4),
            now=round(now, 4),
            words=f"the loop waited on its data {percent(now)} of the time, up from {percent(before)}: loading "
            "got slower",
            fix="Loading got slower with nothing measured on the host to explain it: run loaderdoctor check on "
            "this loader to find out why.",
            tier=SYMPTOM,
            weight=now - before,
        )
    ]


_MEASURES: tuple[Callable[[RunRecord, list[RunRecord]], list[Change]], ...] = (
    other_processes,
    stray_workers,
    _step,
    _settings,
    _dataset,
    _machine,
    _load_average,
    _memory,
    _shm,
    _open_files,
    _wait_share,
)


def _key_changes(keys: list[str], before: dict[str, Any], now: dict[str, Any]) -> str:
    """'num_workers 4 -> 0, persistent_workers True -> False'."""
    return ", ".join(f"{key} {before.get(key)} -> {now.get(key)}" for key in keys)
