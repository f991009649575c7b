"""A trial of the search: one Settings measured once or more, and the verdict on it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.data import dataclass_from_written, field_of

# measured: it ran and delivered batches. stalled / crashed: its run did (never chosen). over-memory: measured
# above the memory budget, or predicted to be from the memory of a measured trial (then never run).
# over-shm: its batches in flight would not fit in /dev/shm (never run). other-data: a whole epoch of it held
# another number of batches than the baseline's (an IterableDataset that does not split its stream across
# workers repeats it in each one).
VERDICTS = ("measured", "stalled", "crashed", "over-memory", "over-shm", "other-data")


@dataclass(frozen=True)
class Measurement:
    """One measured run of a Settings."""

    batches_per_s: float  # over an epoch of the training loop: see tune/measure.py
    outcome: str  # "completed" | "stalled" | "crashed" (the probe's outcome)
    seconds: float  # how long the run took, start-up and stopping included
    memory_bytes: int | None = None  # loading's peak memory: its workers' USS together plus batches in flight
    loading_cores: float | None = None  # cores that loading kept busy (its workers together) in steady running
    # Seconds per second its workers were ready to run but kept off the cores (run delay): the CPU they asked
    # for beyond what they got, taken by other processes or by each other (None: not counted).
    ready_cores: float | None = None
    keeps_up: bool | None = None  # with a training step: the step hardly waited for batches; None without one
    error: str | None = None
    epoch_batches: int | None = None  # the batches of an epoch run to its end, when one was
    copies: int | None = None  # typical copies of a sample within an epoch (IterableDatasets; 1: no repeats)
    startup_s: float | None = None  # from the first iter() to the first batch, apart from the rate
    limit_batches_per_s: float | None = None  # the rate this host could reach, as this run shows it (limit.py)
    limit_binds: str | None = None  # what binds that limit

    def to_dict(self) -> dict[str, Any]:
        return {
            "batches_per_s": round(self.batches_per_s, 3),
            "outcome": self.outcome,
            "seconds": round(self.seconds, 3),
            "memory_mb": None if self.memory_bytes is None else round(self.memory_bytes / 2**20, 1),
            "loading_cores": None if self.loading_cores is None else round(self.loading_cores, 3),
            "ready_cores": None if self.ready_cores is None else round(self.ready_cores, 3),
            "keeps_up": self.keeps_up,
            "error": self.error,
            "epoch_batches": self.epoch_batches,
            "copies": self.copies,
            "startup_s": None if self.startup_s is None else round(self.startup_s, 3),
            "limit_batches_per_s": None if self.limit_batches_per_s is None else round(self.limit_batches_per_s, 3),
            "limit_binds": self.limit_binds,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """The Measurement whose to_dict() is `data`, its memory back in bytes (to the 0.1 MB written)."""
        mb = field_of(data, "memory_mb", float | None) if "memory_mb" in data else None
        return dataclass_from_written(cls, data, memory_bytes=None if mb is None else round(mb * 2**20))


@dataclass
class Trial:
    """A Settings the search considered: its runs (several when a close call was measured again), and why."""

    number: int
    settings: Settings
    phase: str  # "baseline" | "workers" | "refine" | "threads"
    verdict: str
    runs: list[Measurement] = field(default_factory=list)
    note: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")

    @property
    def usable(self) -> bool:
        """Whether the search may choose it: measured, within the budgets, and never stalled or crashed."""
        return self.verdict == "measured"

    @property
    def batches_per_s(self) -> float:
        """The median of its runs' rates (0 when none delivered)."""
        rates = [run.batches_per_s for run in self.runs]
        return statistics.median(rates) if rates else 0.0

    @property
    def memory_bytes(self) -> int | None:
        known = [run.memory_bytes for run in self.runs if run.memory_bytes is not None]
        return max(known) if known else None

    @property
    def loading_cores(self) -> float | None:
        known = [run.loading_cores for run in self.runs if run.loading_cores is not None]
        return statistics.median(known) if known else None

    @property
    def demanded_cores(self) -> float | None:
        """The cores its loading asked for: those it kept busy and those it was ready to run on but waited for
        (median of its runs; where the run delay was not counted, those it kept busy)."""
        known = [run.loading_cores + (run.ready_cores or 0.0) for run in self.runs if run.loading_cores is not None]
        return statistics.median(known) if known else None

    @property
    def limit_batches_per_s(self) -> float | None:
        """The host's limit as its runs showed it (median), for settings whose loading's CPU a run can read
        cleanly: worker processes, one thread each (the training process's own loading may count the spinning
        of torch's thread pool as work). None otherwise or when unknown."""
        settings = self.settings
        if not settings.num_workers or settings.backend != "process":
            return None
        known = [run.limit_batches_per_s for run in self.runs if run.limit_batches_per_s]
        return statistics.median(known) if known else None

    @property
    def keeps_up(self) -> bool:
        """Whether its runs kept up with the training step (the majority of them)."""
        votes = [run.keeps_up for run in self.runs if run.keeps_up is not None]
        return bool(votes) and sum(votes) * 2 > len(votes)

    @property
    def seconds(self) -> float:
        return sum(run.seconds for run in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "settings": self.settings.to_dict(),
            "phase": self.phase,
            "verdict": self.verdict,
            "batches_per_s": round(self.batches_per_s, 3),
            "memory_mb": None if self.memory_bytes is None else round(self.memory_bytes / 2**20, 1),
            "keeps_up": self.keeps_up if any(run.keeps_up is not None for run in self.runs) else None,
            "seconds": round(self.seconds, 3),
            "note": self.note,
            "runs": [run.to_dict() for run in self.runs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trial:
        """The Trial whose to_dict() is `data` (the figures over its runs recomputed from them)."""
        return dataclass_from_written(cls, data)
