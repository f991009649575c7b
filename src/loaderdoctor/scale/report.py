"""The result of `scale`: per loader, one run per rank count (aggregate rate, scaling efficiency, each rank's
figures), the findings across ranks, the lock-free proof and the DDP plan; plain data (schema loaderdoctor.scale/1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.loader.ddp import DdpPlan
from loaderdoctor.plain.data import dataclass_from_written
from loaderdoctor.report import Finding, Verification

SCHEMA = "loaderdoctor.scale/1"


@dataclass
class RankFigures:
    """One rank's loader in one run: its rate, how much of the loop waited on data, what it delivered."""

    rank: int
    samples_per_s: float | None
    wait_fraction: float | None
    batches: int
    outcome: str  # the probe's: "completed" | "stalled" | "crashed"; "failed" when the rank sent nothing
    limit: dict[str, Any] | None = None  # the rank's share of the host's limit (limit.py), as it measured it
    share_of_limit: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "samples_per_s": self.samples_per_s,
            "wait_fraction": self.wait_fraction,
            "batches": self.batches,
            "outcome": self.outcome,
            "limit": self.limit,
            "share_of_limit": self.share_of_limit,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankFigures:
        """The RankFigures whose to_dict() is `data`."""
        return dataclass_from_written(cls, data)


@dataclass
class ScaleRun:
    """One launch of `ranks` ranks (all nodes): their aggregate samples per second and the scaling efficiency,
    that aggregate over `ranks / base_ranks` times the smallest run's (1.0: perfect; base_ranks is 1 unless the
    run started at more)."""

    ranks: int
    samples_per_s: float | None
    efficiency: float | None
    base_ranks: int
    per_rank: list[RankFigures]
    failures: list[str] = field(default_factory=list)  # ranks that died, hung, or were ended: in words

    def __post_init__(self) -> None:
        if min(self.ranks, self.base_ranks) < 1:
            raise ValueError(f"a run has 1 rank or more, not {min(self.ranks, self.base_ranks)}")

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "samples_per_s": self.samples_per_s,
            "efficiency": self.efficiency,
            "efficiency_base_ranks": self.base_ranks,
            "per_rank": [r.to_dict() for r in self.per_rank],
            "failures": self.failures,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScaleRun:
        """The ScaleRun whose to_dict() is `data`."""
        return dataclass_from_written(cls, data, {"efficiency_base_ranks": "base_ranks"})


@dataclass
class ScaleLoaderReport:
    """One loader's scale: a run per rank count, the findings across ranks, the lock-free proof, the DDP plan."""

    name: str
    runs: list[ScaleRun]
    findings: list[Finding]
    verification: Verification | None = None
    plan: DdpPlan | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": [run.to_dict() for run in self.runs],
            "findings": [f.to_dict() for f in self.findings],
            "verification": None if self.verification is None else self.verification.to_dict(),
            "plan": None if self.plan is None else self.plan.to_dict(),
        }

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> ScaleLoaderReport:
        """The ScaleLoaderReport of loader `name` whose to_dict() is `data`."""
        return dataclass_from_written(cls, data, name=name)


@dataclass
class ScaleReport:
    """A scale of a target's loaders (schema loaderdoctor.scale/1)."""

    target: str
    loaders: dict[str, ScaleLoaderReport]
    nnodes: int = 1
    # _repr_html_ (a notebook's view) and __str__ (the console text) are lent by commands/showing.py: render/ is above

    @property
    def critical(self) -> bool:
        """A critical finding, or a run whose ranks failed."""
        return any(f.severity == "critical" for lr in self.loaders.values() for f in lr.findings) or any(
            run.failed for lr in self.loaders.values() for run in lr.runs
        )

    @property
    def exit_status(self) -> int:
        return 1 if self.critical else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "target": self.target,
            "nnodes": self.nnodes,
            "loaders": {name: lr.to_dict() for name, lr in self.loaders.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScaleReport:
        """The ScaleReport whose to_dict() is `data`."""
        return dataclass_from_written(cls, data)
