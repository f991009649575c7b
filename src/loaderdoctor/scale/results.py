"""What each rank sends back (RankResult: its Recordings and the facts of its loaders) and what a launch gave
(LaunchResult: every rank's result, or why a rank failed): plain data that loads back from its JSON."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loaderdoctor.loader.facts import LoaderFacts
from loaderdoctor.recording.record import Recording


@dataclass
class RankLoader:
    """One loader as one rank measured it."""

    recording: Recording
    facts: LoaderFacts
    collective_error: str | None = None  # the step's collective failed: another rank stopped answering

    def to_dict(self) -> dict[str, Any]:
        return {
            "recording": self.recording.to_dict(),
            "facts": dataclasses.asdict(self.facts),
            "collective_error": self.collective_error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankLoader:
        return cls(
            Recording.from_dict(data["recording"]), LoaderFacts.from_dict(data["facts"]), data["collective_error"]
        )


@dataclass
class RankResult:
    """What one rank measured, or the error that kept it from measuring."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    loaders: dict[str, RankLoader] = field(default_factory=dict)
    error: str | None = None  # a usage error or the user's code raising: the same on every rank, as a rule
    hint: str | None = None
    usage_error: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "loaders"}
        data["loaders"] = {name: loader.to_dict() for name, loader in self.loaders.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankResult:
        fields = {k: v for k, v in data.items() if k != "loaders"}
        loaders = {name: RankLoader.from_dict(value) for name, value in data["loaders"].items()}
        return cls(**fields, loaders=loaders)


@dataclass
class RankFailure:
    """A rank that ended without a result: killed, crashed, or ended by the launcher or the budget."""

    rank: int
    exitcode: int | None
    signal: str | None  # "SIGKILL" when a signal ended it
    message: str  # what the launcher or the rank's own error output said, shortened

    def describe(self) -> str:
        how = f"was killed by {self.signal}" if self.signal else f"exited with status {self.exitcode}"
        return f"rank {self.rank} {how}" + (f": {self.message}" if self.message else "")


@dataclass
class LaunchResult:
    """One launch of `world_size` ranks: the results that came back (all ranks' when they could gather them,
    else this node's), the ranks that failed, and a note when the launch as a whole did not end well."""

    world_size: int
    ranks_per_node: int
    results: list[RankResult] = field(default_factory=list)
    failures: list[RankFailure] = field(default_factory=list)
    note: str | None = None  # e.g. "ended by the budget after 95 s: ranks 1 did not finish"
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "ranks_per_node": self.ranks_per_node,
            "results": [r.to_dict() for r in self.results],
            "failures": [dataclasses.asdict(f) for f in self.failures],
            "note": self.note,
            "wall_s": self.wall_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchResult:
        return cls(
            world_size=data["world_size"],
            ranks_per_node=data["ranks_per_node"],
            results=[RankResult.from_dict(r) for r in data["results"]],
            failures=[RankFailure(**f) for f in data["failures"]],
            note=data["note"],
            wall_s=data["wall_s"],
        )


def written_results(ranks_dir: str | Path) -> list[RankResult]:
    """The results the ranks of this node wrote (rank-N.json), by rank: what outlives a launch that failed."""
    results = []
    for path in sorted(Path(ranks_dir).glob("rank-*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            results.append(RankResult.from_dict(json.loads(path.read_text())))
    return sorted(results, key=lambda r: r.rank)
