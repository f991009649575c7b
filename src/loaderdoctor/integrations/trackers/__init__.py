"""Experiment trackers (Weights & Biases, MLflow, TensorBoard): a report's findings, main figures and HTML page
logged to the one a team already reads, by `loaderdoctor.log_to` or `--log-to TRACKER`."""

from __future__ import annotations

import inspect
from typing import Any

from loaderdoctor.errors import UsageError
from loaderdoctor.integrations.trackers.mlflow import MlflowTracker
from loaderdoctor.integrations.trackers.summary import Summary, summarize
from loaderdoctor.integrations.trackers.tensorboard import TensorBoardTracker
from loaderdoctor.integrations.trackers.tracker import METRIC_PREFIX, Tracker, require_installed
from loaderdoctor.integrations.trackers.wandb import WandbTracker
from loaderdoctor.render.kinds import kind_of, report_page
from loaderdoctor.saved import as_saved

# Each tracker by the name --log-to takes, with the package it needs.
TRACKERS: dict[str, tuple[type, str]] = {
    "wandb": (WandbTracker, "wandb"),
    "mlflow": (MlflowTracker, "mlflow"),
    "tensorboard": (TensorBoardTracker, "tensorboard"),
}

__all__ = ["METRIC_PREFIX", "TRACKERS", "Summary", "Tracker", "check_tracker", "log_to", "make_tracker", "summarize"]


def check_tracker(name: str) -> str:
    """`name`, when it is a tracker whose package is installed; else a UsageError (exit status 2) that says which
    names there are, or which extra to install."""
    if name not in TRACKERS:
        raise UsageError(f"unknown tracker {name!r}: use one of {', '.join(TRACKERS)}")
    require_installed(TRACKERS[name][1], name)
    return name


def make_tracker(name: str, **options: Any) -> Tracker:
    """The tracker called `name`, made with its `options`: a UsageError naming those it takes for another."""
    make = TRACKERS[check_tracker(name)][0]
    try:
        inspect.signature(make).bind(**options)
    except TypeError:
        takes = [p.name for p in inspect.signature(make).parameters.values() if p.kind is p.KEYWORD_ONLY]
        raise UsageError(
            f"{name} takes no option {', '.join(repr(o) for o in options if o not in takes)}: it takes "
            f"{', '.join(takes)}"
        ) from None
    return make(**options)


def log_to(report: Any, tracker: str, **options: Any) -> str:
    """Log a report of check, tune, scale or run to an experiment tracker ("wandb", "mlflow" or "tensorboard"):
    its findings (rule, severity, title, per loader), its main figures (rate, wait share, share of the host's
    limit, verified speedup, per loader) and its HTML page. `options` are the tracker's: wandb's `project` (and
    wandb.init's), mlflow's `experiment` and `run_name`, tensorboard's `log_dir` and `step`. An active W&B or
    MLflow run is logged to as it is; else one is started and ended. Returns where it went, in words."""
    kind_of(report)  # a TypeError that says so for anything else
    chosen = make_tracker(tracker, **options)
    shown = as_saved(report)  # the page drawn from the report as its JSON loads back, as every renderer sees it
    return chosen.log(summarize(shown), report_page(shown))
