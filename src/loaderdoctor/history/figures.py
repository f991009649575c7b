"""A measured change between two runs of the same name (Change, ranked by tier) and the readers of the runs'
figures that the checks of history/changes.py and history/processes.py share."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.history.records import RunRecord
from loaderdoctor.plain.numbers import MIB

# Processes take cores from a run in earnest from half a core, or from a quarter of the usable cores on a machine
# of fewer than two.
STRONG_CORES = 0.5
STRONG_CORES_SHARE = 0.25

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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if _is_number(value) else None


def median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def host_figures(run: RunRecord, compared: list[RunRecord], key: str) -> tuple[float | None, float | None]:
    """A host figure now, and its median over the runs compared."""
    return number(run.host, key), median(number(r.host, key) for r in compared)


def usable_cores(run: RunRecord) -> float | None:
    return number(run.host, "usable_cores") or number(run.host, "cpu_count")


def takes_cores(cores: float, usable: float | None) -> bool:
    """Whether processes taking `cores` take them from the run in earnest (STRONG_CORES, STRONG_CORES_SHARE)."""
    return cores >= STRONG_CORES or (usable is not None and usable > 0 and cores / usable >= STRONG_CORES_SHARE)


def share(part: float, whole: float | None) -> float:
    return part / whole if whole else part


def figure(value: float) -> str:
    """A rate or a time as a title shows it: three significant digits, whole numbers from 100."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GB" if nbytes >= 2**30 else f"{nbytes / MIB:.0f} MB"
