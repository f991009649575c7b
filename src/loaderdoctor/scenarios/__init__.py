"""The built-in scenarios: small realistic pipelines, each with one planted cause (or none, `healthy`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from loaderdoctor.errors import UsageError
from loaderdoctor.loader.workload import Workload

# name -> the rule id its planted cause should produce as the main diagnosis (None: no warning at all), found
# by `check` unless the scenario's module says FOUND_BY = "scale" (a cause only ranks together show)
PLANTED_CAUSES: dict[str, str | None] = {
    "demo": "input-bound",
    "healthy": None,
    "starved": "input-bound",
    "respawn": "worker-respawn",
    "fork-deadlock": "fork-unsafe",
    "memory-growth": "memory-growth",
    "oversubscribed": "cpu-oversubscription",
    "bad-samples": "sample-errors",
    "slow-start": "slow-start",
    "lock-contention": "lock-contention",
    "no-distributed-sampler": "distributed-sampler",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    planted_cause: str | None
    build: Callable[[], Workload]
    found_by: str = "check"  # the command whose report names the planted cause: "check" or "scale"


def _module_name(name: str) -> str:
    return f"loaderdoctor.scenarios.{name.replace('-', '_')}"


def get(name: str) -> Scenario:
    """The scenario called `name`, or a UsageError listing the ones there are."""
    if name not in PLANTED_CAUSES:
        raise UsageError(f"no built-in scenario named {name!r}", hint=f"choose one of: {', '.join(names())}")
    module = importlib.import_module(_module_name(name))
    return Scenario(name, module.SUMMARY, PLANTED_CAUSES[name], module.build, getattr(module, "FOUND_BY", "check"))


def names() -> list[str]:
    return list(PLANTED_CAUSES)


def all_scenarios() -> list[Scenario]:
    return [get(name) for name in names()]
