"""What a tracker logs of a check, run, tune or scale report: each loader's main figures and its findings, read
from the report's plain data, with the names and titles it holds as given but bounded in length."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.kinds import BY_SCHEMA

# A loader's name or a target as logged (the HTML page keeps them whole), and a finding's title.
MAX_NAME = 120
MAX_TITLE = 300
# A loader's part of a figure's key: the characters every tracker takes in a key (MLflow's are the fewest).
MAX_KEY_NAME = 100
_KEY_UNSAFE = re.compile(r"[^\w\-. :/]")


def bounded(text: str, limit: int) -> str:
    """`text` as given when it is `limit` characters or fewer, else its first ones and an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Summary:
    """One report as a tracker logs it: `figures` by "LOADER/FIGURE" (the tracker puts its prefix before them),
    and the findings, one dict each of loader, rule, severity and title."""

    kind: str  # "check", "run", "tune" or "scale"
    target: str
    figures: dict[str, float] = field(default_factory=dict)
    findings: list[dict[str, str]] = field(default_factory=list)

    def findings_text(self) -> str:
        """The findings as lines of text, the most severe first as the report orders them: "critical
        input-bound (train): the training loop waits on data 63% of the time"."""
        if not self.findings:
            return "no findings"
        return "\n".join(f"{f['severity']} {f['rule']} ({f['loader']}): {f['title']}" for f in self.findings)


def summarize(report: Any) -> Summary:
    """The Summary of a report of check or run (schema loaderdoctor.check/1), tune or scale, read from its
    to_dict(): what its JSON holds, the figures a reader looks for first."""
    data = report.to_dict()
    kind = BY_SCHEMA[data["schema"]].name
    read = {"check": _check_figures, "tune": _tune_figures, "scale": _scale_figures}[kind]
    summary = Summary(data.get("command") or kind, bounded(str(data["target"]), MAX_NAME))
    keys = _loader_keys(list(data["loaders"]))
    for name, loader in data["loaders"].items():
        for figure, value in read(loader).items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                summary.figures[f"{keys[name]}/{figure}"] = float(value)
        for finding in loader.get("findings", []):
            summary.findings.append(
                {
                    "loader": bounded(name, MAX_NAME),
                    "rule": bounded(str(finding["rule"]), MAX_NAME),
                    "severity": str(finding["severity"]),
                    "title": bounded(str(finding["title"]), MAX_TITLE),
                }
            )
    return summary


def _check_figures(loader: dict[str, Any]) -> dict[str, Any]:
    """A checked (or watched) loader: its rate, the share of the loop that waited on data, its share of the host's
    limit, and its fix's measured speedup (none where the pairs of windows differed too much for one figure)."""
    measured = loader["measurements"]
    verification = loader.get("verification") or {}
    return {
        "batches_per_s": measured.get("batches_per_s"),
        "wait_fraction": measured.get("wait_fraction"),
        "share_of_limit": measured.get("share_of_limit"),
        "verified_speedup": None if verification.get("unsteady") else verification.get("speedup"),
    }


def _tune_figures(tuning: dict[str, Any]) -> dict[str, Any]:
    """A tuned loader: the user's settings' rate and share of the limit, the chosen settings' (measured against
    them: the speedup)."""
    found = tuning["chosen"].get("batches_per_s", 0) > 0
    return {
        "batches_per_s": tuning["baseline"].get("batches_per_s"),
        "share_of_limit": tuning.get("baseline_share_of_limit"),
        "tuned_batches_per_s": tuning["chosen"].get("batches_per_s") if found else None,
        "tuned_share_of_limit": tuning.get("share_of_limit") if found else None,
        "verified_speedup": tuning.get("speedup") if found else None,
    }


def _scale_figures(loader: dict[str, Any]) -> dict[str, Any]:
    """A scaled loader, at its largest rank count: the ranks' samples per second and scaling efficiency, the wait
    share and share of the limit of the rank that waited most (DDP's step waits for it), and the lock-free proof's
    speedup."""
    runs = loader.get("runs") or []
    largest = max(runs, key=lambda run: run["ranks"], default=None)
    if largest is None:
        return {}
    ranks = largest.get("per_rank") or []
    waits = [rank for rank in ranks if isinstance(rank.get("wait_fraction"), int | float)]
    slowest = max(waits, key=lambda rank: rank["wait_fraction"], default={})
    verification = loader.get("verification") or {}
    return {
        "ranks": largest["ranks"],
        "samples_per_s": largest.get("samples_per_s"),
        "scaling_efficiency": largest.get("efficiency"),
        "wait_fraction": slowest.get("wait_fraction"),
        "share_of_limit": slowest.get("share_of_limit"),
        "verified_speedup": None if verification.get("unsteady") else verification.get("speedup"),
    }


def _loader_keys(names: list[str]) -> dict[str, str]:
    """Each loader's part of a figure's key: its name with what a tracker refuses in a key made "_", no empty
    or dot-only part between slashes, bounded; two names that come out alike are told apart by a number."""
    keys: dict[str, str] = {}
    for name in names:
        parts = [_KEY_UNSAFE.sub("_", part).strip() for part in name[:MAX_KEY_NAME].split("/")]
        key = "/".join(part if part.strip(".") else "_" for part in parts if part) or "_"
        unique, number = key, 2
        while unique in keys.values():
            unique, number = f"{key}_{number}", number + 1
        keys[name] = unique
    return keys
