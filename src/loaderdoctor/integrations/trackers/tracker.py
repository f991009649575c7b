"""The interface every experiment tracker has (its name, and log(summary, page)), and the import of its client
library, refused in words that name the extra to install."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Protocol

from loaderdoctor.errors import UsageError
from loaderdoctor.integrations.trackers.summary import Summary

# Where the figures go in every tracker: "loaderdoctor/train/batches_per_s".
METRIC_PREFIX = "loaderdoctor/"
EXTRA_HINT = "pip install 'loaderdoctor[trackers]'"


class Tracker(Protocol):
    """An experiment tracker, made with its options, that logs a report's summary and its HTML page."""

    name: str

    def log(self, summary: Summary, page: str) -> str:
        """Log the findings, the figures and the page: where they went, in words ("MLflow run 3f2a... in ...")."""
        ...


def require(module: str, tracker: str) -> ModuleType:
    """The client library `module` of `tracker`, imported; a UsageError naming the extra where it is missing."""
    require_installed(module, tracker)
    return importlib.import_module(module)


def require_installed(module: str, tracker: str) -> None:
    """A UsageError (exit status 2) naming the extra to install unless `module` can be imported; checked without
    importing it, which takes a tracker's library seconds."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"logging to {tracker} needs the {module} package, which is not installed", hint=EXTRA_HINT)
