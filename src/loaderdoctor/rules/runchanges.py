"""ranked_changes(): what changed between a run and the earlier runs it is compared with (on the host, in its
settings, its data or its step), each change worded with its fix, likeliest cause first."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loaderdoctor.rules._common import MIB, percent
from loaderdoctor.rules.host import CMDLINE_CHARS
from loaderdoctor.settings import Settings
from loaderdoctor.words import plural

if TYPE_CHECKING:  # at run time the history imports the rules, not the other way round
    from loaderdoctor.history.records import RunRecord

# Processes take cores from a run in earnest from half a core, or from a quarter of the usable cores on a machine
# of fewer than two; below a tenth of a core a process is noise (OtherLoad names none below it).
STRONG_CORES = 0.5
STRONG_CORES_SHARE = 0.25
NAMED_CORES = 0.1
NAMED_PROCESSES = 5
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

# The likeliest cause first, by tier, then within a tier by the share of the machine (or of the batch interval) the
# change accounts for. Named processes taking cores in earnest come first: other processes, and stray workers of
# earlier runs (FAILURE-MODES.md 6), both measured in cores; then a slower training step while the wait share held
# (the input is not to blame); then what the user changed (settings, data, machine), not measurable in cores but
# certain; then the host's load that no process explains (load average, swap, less memory) and processes taking
# less than STRONG_CORES; then what rarely slows a run by itself (/dev/shm, open files); last the symptom that
# loading got slower, which says where the time went but not why.
TAKES_CORES, STEP, CHANGED_RUN, HOST_LOAD, HOST_STATE, SYMPTOM = range(6)


@dataclass
class Change:
    """One measured difference between the run and the runs compared, with the fix it calls for."""

    what: str
    before: Any
    now: Any
    words: str
    fix: str
    tier: int
    weight: float  # share of the machine or of the batch interval it accounts for, to rank within a tier
    snippet: str | None = None
    settings_change: dict[str, Any] = field(default_factory=dict)
    processes: list[dict[str, Any]] = field(default_factory=list)  # the processes it names

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "before": self.before, "now": self.now, "words": self.words}


def ranked_changes(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Every measured change between `run` and the runs compared, likeliest cause first (see TAKES_CORES...)."""
    found: list[Change] = []
    for measure in _MEASURES:
        found.extend(measure(run, compared))
    return sorted(found, key=lambda change: (change.tier, -change.weight))


def _other_processes(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Processes outside the run (stray workers apart) taking more cores during it than during the runs compared."""
    strays = {p.get("pid") for p in _stray_list(run.host)}
    now = [p for p in _process_list(run.host) if p.get("pid") not in strays]
    now_cores = sum((_cores(p) for p in now), 0.0)
    known_before = [r.host["other_processes"] for r in compared if isinstance(r.host.get("other_processes"), list)]
    before_cores = statistics.median(sum((_cores(p) for p in ps), 0.0) for ps in known_before) if known_before else 0.0
    rise = now_cores - before_cores
    if rise < NAMED_CORES:
        return []
    # A command line that ran as busy before too is not what changed; name the rest, busiest first.
    usual: dict[str, float] = {}
    for processes in known_before:
        for p in processes:
            usual[p.get("cmdline", "")] = usual.get(p.get("cmdline", ""), 0.0) + _cores(p) / len(known_before)
    named = [p for p in now if _cores(p) - usual.get(p.get("cmdline", ""), 0.0) >= NAMED_CORES] or now
    named = sorted(named, key=_cores, reverse=True)[:NAMED_PROCESSES]
    usable = _usable_cores(run)
    of_cores = f" of {figure(usable)}" if usable else ""
    was = f" ({before_cores:.1f} before)" if before_cores >= 0.05 else ""
    pids = " ".join(str(p.get("pid")) for p in named)
    return [
        Change(
            what="other_processes",
            before=round(before_cores, 2),
            now=round(now_cores, 2),
            words=f"other processes took {now_cores:.1f}{of_cores} cores{was}: {_processes_words(named)}",
            fix=(
                f"Other processes took {now_cores:.1f}{of_cores} cores during this run: end them (kill {pids}), or "
                f"lower their priority (renice -n 19 -p {pids}), or run where they do not."
            ),
            snippet=f"renice -n 19 -p {pids}  # or end them: kill {pids}",
            tier=TAKES_CORES if _takes_cores(rise, usable) else HOST_LOAD,
            weight=_share(rise, usable),
            processes=[_named(p, stray=False) for p in named],
        )
    ]


def _stray_workers(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Orphaned DataLoader workers of earlier runs, more of them or busier than at the runs compared."""
    strays = _stray_list(run.host)
    if not strays:
        return []
    # The 0.2 s sample at the start, or what they took during the run when the caller measured it: the larger.
    during = {p.get("pid"): _cores(p) for p in _process_list(run.host)}
    cores_of = {s.get("pid"): max(_stray_cores(s), during.get(s.get("pid"), 0.0)) for s in strays}
    now_cores = sum(cores_of.values())
    known_before = [_stray_list(r.host) for r in compared if isinstance(r.host.get("stray_workers"), list)]
    before_count = statistics.median(len(s) for s in known_before) if known_before else 0
    before_cores = statistics.median(sum(map(_stray_cores, s)) for s in known_before) if known_before else 0.0
    if len(strays) <= before_count and now_cores - before_cores < NAMED_CORES:
        return []
    strays = sorted(strays, key=lambda s: cores_of[s.get("pid")], reverse=True)
    usable = _usable_cores(run)
    shown = [{**s, "cores": cores_of[s.get("pid")]} for s in strays[:NAMED_PROCESSES]]
    pids = " ".join(str(s.get("pid")) for s in strays)
    return [
        Change(
            what="stray_workers",
            before=before_count,
            now=len(strays),
            words=(
                f"{plural(len(strays), 'stray DataLoader worker')} of earlier runs took {now_cores:.1f} "
                f"{'core' if round(now_cores, 1) == 1 else 'cores'}: {_processes_words(shown)}"
            ),
            fix=(
                "DataLoader workers of earlier runs that were killed hard, whose parent is gone, take cores from "
                f"every run until they end: kill {pids}"
            ),
            snippet=f"kill {pids}",
            tier=TAKES_CORES if _takes_cores(now_cores, usable) else HOST_LOAD,
            weight=_share(now_cores, usable),
            processes=[_named(s, stray=True) for s in shown],
        )
    ]


def _step(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """A slower training step; the likely cause when the share of time waiting on data did not rise with it."""
    now = number(run.measurements, "step_ms")
    before = _median(number(r.measurements, "step_ms") for r in compared)
    if now is None or before is None or before <= 0 or now < STEP_SLOWER_RATIO * before:
        return []
    interval = number(run.measurements, "interval_ms") or now
    share = min(1.0, (now - before) / interval)
    if share < STEP_SHARE_OF_INTERVAL:
        return []
    wait_now = number(run.measurements, "wait_fraction")
    wait_before = _median(number(r.measurements, "wait_fraction") for r in compared)
    held = wait_now is not None and wait_before is not None and wait_now <= wait_before + WAIT_SHARE_NOISE
    words = f"the training step took {figure(now)} ms a batch, up from {figure(before)} ms"
    if held and wait_now is not None and wait_before is not None:
        words += (
            f", and the share of time waiting on data did not rise ({percent(wait_now)}, "
            f"{percent(wait_before)} before): the slowdown is the model's step, not the input"
        )
    return [
        Change(
            what="step_ms",
            before=round(before, 3),
            now=round(now, 3),
            words=words,
            fix=(
                f"The training step itself got slower ({figure(before)} -> {figure(now)} ms a batch)"
                + (", not the input: more workers will not help. " if held else ". ")
                + "Profile the step (torch.profiler) and look at what changed in the model, its inputs' shapes, "
                "the device or the libraries."
            ),
            tier=STEP if held else HOST_LOAD,
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
        snippet = Settings.from_dict(before).snippet()
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
    now, before = _host_figures(run, compared, "load_avg_1m")
    usable = _usable_cores(run)
    if now is None or before is None or not _takes_cores(now - before, usable):
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
            weight=_share(now - before, usable),
        )
    ]


def _memory(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """Less memory available, and swap in use: the machine pages to disk."""
    changes = []
    total = number(run.host, "memory_total_bytes")
    swap_now, swap_before = _host_figures(run, compared, "swap_used_bytes")
    if swap_now is not None and swap_before is not None and swap_now - swap_before >= SWAP_RISE_BYTES:
        changes.append(
            Change(
                what="swap_used_bytes",
                before=int(swap_before),
                now=int(swap_now),
                words=f"swap in use {_size(swap_now)}, up from {_size(swap_before)}: the machine pages to disk",
                fix="The machine is short of memory and pages to disk: end what holds memory, or lower num_workers "
                "or prefetch_factor.",
                tier=HOST_LOAD,
                weight=_share(swap_now - swap_before, total),
            )
        )
    available_now, available_before = _host_figures(run, compared, "memory_available_bytes")
    if available_now is None or available_before is None or not total:
        return changes
    if available_before - available_now >= MEMORY_DROP_SHARE * total:
        changes.append(
            Change(
                what="memory_available_bytes",
                before=int(available_before),
                now=int(available_now),
                words=f"memory available {_size(available_now)} of {_size(total)}, down from {_size(available_before)}",
                fix="Other processes hold memory the earlier runs had: end them, or lower num_workers or "
                "prefetch_factor.",
                tier=HOST_LOAD,
                weight=_share(available_before - available_now, total),
            )
        )
    return changes


def _shm(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """More of /dev/shm in use at the start: files that ended runs left behind, or other jobs'."""
    now, before = _host_figures(run, compared, "shm_used_bytes")
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
            words=f"/dev/shm held {_size(now)} of {_size(total)} at the start, up from {_size(before)}",
            fix="/dev/shm fills up: look for what ended runs left there (ls -la /dev/shm) and remove it.",
            tier=HOST_STATE,
            weight=_share(rise, total),
        )
    ]


def _open_files(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """More files open in the process at the start."""
    now, before = _host_figures(run, compared, "open_fds")
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
            weight=_share(now - before, limit),
        )
    ]


def _wait_share(run: RunRecord, compared: list[RunRecord]) -> list[Change]:
    """A larger share of time waiting on data: loading got slower (a symptom; the causes are above it)."""
    now = number(run.measurements, "wait_fraction")
    before = _median(number(r.measurements, "wait_fraction") for r in compared)
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
    _other_processes,
    _stray_workers,
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

# Figures and words


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if _is_number(value) else None


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _host_figures(run: RunRecord, compared: list[RunRecord], key: str) -> tuple[float | None, float | None]:
    """A host figure now, and its median over the runs compared."""
    return number(run.host, key), _median(number(r.host, key) for r in compared)


def _usable_cores(run: RunRecord) -> float | None:
    return number(run.host, "usable_cores") or number(run.host, "cpu_count")


def _takes_cores(cores: float, usable: float | None) -> bool:
    """Whether processes taking `cores` take them from the run in earnest (STRONG_CORES, STRONG_CORES_SHARE)."""
    return cores >= STRONG_CORES or (usable is not None and usable > 0 and cores / usable >= STRONG_CORES_SHARE)


def _share(part: float, whole: float | None) -> float:
    return part / whole if whole else part


def _process_list(host: dict[str, Any]) -> list[dict[str, Any]]:
    processes = host.get("other_processes")
    return [p for p in processes if isinstance(p, dict)] if isinstance(processes, list) else []


def _stray_list(host: dict[str, Any]) -> list[dict[str, Any]]:
    strays = host.get("stray_workers")
    return [s for s in strays if isinstance(s, dict)] if isinstance(strays, list) else []


def _cores(process: dict[str, Any]) -> float:
    return number(process, "cores") or 0.0


def _stray_cores(stray: dict[str, Any]) -> float:
    return (number(stray, "cpu_percent") or 0.0) / 100


def _named(process: dict[str, Any], *, stray: bool) -> dict[str, Any]:
    return {
        "pid": process.get("pid"),
        "cmdline": _cmdline(process),
        "cores": round(_cores(process), 2),
        "stray": stray,
    }


def _cmdline(process: dict[str, Any]) -> str:
    """A process's command line, cut to CMDLINE_CHARS with an ellipsis."""
    text = str(process.get("cmdline") or "")
    return text if len(text) <= CMDLINE_CHARS else text[: CMDLINE_CHARS - 1].rstrip() + "…"


def _processes_words(processes: list[dict[str, Any]]) -> str:
    """'pid 4242 python hog.py (0.97 cores), pid 4243 ...'."""
    words = []
    for p in processes:
        cmdline = _cmdline(p)
        command = f" {cmdline}" if cmdline else ""
        words.append(f"pid {p.get('pid')}{command} ({_cores(p):.2f} cores)")
    return ", ".join(words)


def _key_changes(keys: list[str], before: dict[str, Any], now: dict[str, Any]) -> str:
    """'num_workers 4 -> 0, persistent_workers True -> False'."""
    return ", ".join(f"{key} {before.get(key)} -> {now.get(key)}" for key in keys)


def figure(value: float) -> str:
    """A rate or a time as a title shows it: three significant digits, whole numbers from 100."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GB" if nbytes >= 2**30 else f"{nbytes / MIB:.0f} MB"
