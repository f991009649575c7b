"""The guard's events: plain records of every setting change, stall, worker death, restart and skipped sample."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

EVENT_KINDS = ("setting-changed", "stall", "worker-died", "restart", "sample-skipped")


@dataclass(frozen=True)
class GuardEvent:
    """One thing the guard noticed or did; `detail` holds JSON-ready data (numbers, strings, lists, dicts)."""

    kind: str  # one of EVENT_KINDS
    epoch: int
    batch: int  # the epoch's first batch not yet delivered when it happened (sample-skipped: the sample's batch)
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"unknown guard event kind {self.kind!r}; one of {', '.join(EVENT_KINDS)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
