"""loaderdoctor tune: a measured search for a loader's fastest safe settings (see strategy.py for how)."""

from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.run import tune

__all__ = ["LoaderTuning", "TuneReport", "tune"]
