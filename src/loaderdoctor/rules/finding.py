"""Finding: one diagnosis of a rule (what is wrong, the numbers that show it, what to change), plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.plain.data import dataclass_from_written

SEVERITIES = ("critical", "warning", "info")

# TensorFlow's input-pipeline analyzer draws the same lines: under 5% of the time is not worth a warning,
# over 20% is the main cost of the run.
CRITICAL_TIME_SHARE = 0.20
WARNING_TIME_SHARE = 0.05


def time_cost_severity(fraction: float) -> str | None:
    """The severity of a measured share of the run's time, None when it is too small to mention."""
    if fraction > CRITICAL_TIME_SHARE:
        return "critical"
    if fraction >= WARNING_TIME_SHARE:
        return "warning"
    return None


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
            "settings_change": self.settings_change,
            "impact": self.impact,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """The Finding whose to_dict() is `data`."""
        return dataclass_from_written(cls, data)
