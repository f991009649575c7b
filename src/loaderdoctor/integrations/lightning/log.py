"""The Lightning callback's figures to the trainer's own loggers (rank 0 alone calls these): each loader's stretch
as the fit goes, and at its end each loader's main figures over the whole fit, as --log-to logs a report's."""

from __future__ import annotations

import logging
from typing import Any

from loaderdoctor.integrations.trackers import METRIC_PREFIX, summarize
from loaderdoctor.integrations.trainer.hooked import HookedLoader
from loaderdoctor.report import LoaderReport, Report

log = logging.getLogger("loaderdoctor")


def log_stretch(trainer: Any, key: str, hooked: HookedLoader, cost_per_hour: float | None) -> None:
    """The loader's stretch since it was last logged, to every logger of the trainer."""
    stretch = hooked.stretch()
    if not trainer.loggers or not stretch.batches:
        return
    metrics: dict[str, float] = {}
    if stretch.wait_fraction is not None:
        metrics[f"{METRIC_PREFIX}{key}_wait_fraction"] = stretch.wait_fraction
        if cost_per_hour is not None:
            metrics[f"{METRIC_PREFIX}{key}_wait_cost_per_hour"] = cost_per_hour * stretch.wait_fraction
    if stretch.batches_per_s is not None:
        metrics[f"{METRIC_PREFIX}{key}_batches_per_s"] = stretch.batches_per_s
    _to_loggers(trainer, metrics)


def log_fit_figures(trainer: Any, base: str, names: dict[str, str], reports: dict[str, LoaderReport]) -> None:
    """At the fit's end, each loader's (`names`: its key, "train" or "val", to its run's name) main figures over the
    whole fit, as --log-to logs a report's (integrations/trackers/summary.py), to every logger of the trainer:
    loaderdoctor/train/batches_per_s, .../wait_fraction, .../share_of_limit. Never raises."""
    if not trainer.loggers:
        return
    try:
        by_key = {key: reports[name] for key, name in names.items() if name in reports}
        figures = summarize(Report(base, by_key, "run")).figures
        _to_loggers(trainer, {METRIC_PREFIX + key: value for key, value in figures.items()})
    except Exception as error:
        log.warning("loaderdoctor could not log the fit's figures: %s: %s", type(error).__name__, error)


def _to_loggers(trainer: Any, metrics: dict[str, float]) -> None:
    """`metrics` to every logger of the trainer, at its global step."""
    if metrics:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
