"""The result of a check: findings, verification and the report they make, all plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.recording import Recording, measurements
from loaderdoctor.settings import Settings

SEVERITIES = ("critical", "warning", "info")
SCHEMA = "loaderdoctor.check/1"


@dataclass
class Finding:
    """One diagnosis: what is wrong, the measured numbers that show it, and what to change."""

    rule: str
    severity: str  # "critical" | "warning" | "info"
    title: str
    evidence: dict[str, Any]
    fix: str
    snippet: str | None = None
    settings_change: dict[str, Any] = field(default_factory=dict)  # what prescribe applies to Settings
    impact: float = 0.0  # measured share of wall time this costs (0..1), for ordering; 1.0 for a hang

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "evidence": self.evidence,
            "fix": self.fix,
            "snippet": self.snippet,
        }


@dataclass
class Verification:
    """The prescribed settings measured through the same probe as the original ones."""

    settings: Settings
    before: float  # batches per second with the user's settings
    after: float  # batches per second with the prescribed ones
    before_outcome: str
    after_outcome: str
    helped: bool  # the fix is presented as one only when this holds
    note: str
    after_recording: Recording | None = None
    source: str = "rules"  # "rules": the findings' combined fix; "tune": the tuner's quick search found it

    @property
    def speedup(self) -> float | None:
        return self.after / self.before if self.before > 0 else None

    def to_dict(self) -> dict[str, Any]:
        speedup = self.speedup
        return {
            "settings": self.settings.to_dict(),
            "before": round(self.before, 3),
            "after": round(self.after, 3),
            "speedup": None if speedup is None else round(speedup, 3),
            "before_outcome": self.before_outcome,
            "after_outcome": self.after_outcome,
            "helped": self.helped,
            "note": self.note,
            "source": self.source,
        }


@dataclass
class LoaderReport:
    name: str
    recording: Recording
    findings: list[Finding]
    verification: Verification | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.recording.settings.to_dict(),
            "measurements": measurements(self.recording),
            "findings": [f.to_dict() for f in self.findings],
            "verification": None if self.verification is None else self.verification.to_dict(),
        }


@dataclass
class Report:
    target: str
    loaders: dict[str, LoaderReport]

    @property
    def critical(self) -> bool:
        return any(f.severity == "critical" for lr in self.loaders.values() for f in lr.findings)

    @property
    def exit_status(self) -> int:
        return 1 if self.critical else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "target": self.target,
            "loaders": {name: lr.to_dict() for name, lr in self.loaders.items()},
        }
