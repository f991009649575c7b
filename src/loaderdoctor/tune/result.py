"""The result of a tune: per loader, every trial, the baseline and the chosen settings, all plain data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.data import dataclass_from_written, field_of
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.trial import Trial

SCHEMA = "loaderdoctor.tune/1"


@dataclass
class LoaderTuning:
    """One loader's search: what it tried, what it started from, and what it chose."""

    name: str
    trials: list[Trial]
    baseline: Trial
    chosen: Trial
    limits: Limits
    seconds: float
    stopped: str  # "converged" | "budget" | "interrupted" (Ctrl-C: nothing chosen)
    step_ms: float | None  # the training step's mean time, None without one
    loader_class: str = ""  # the loader's class ("module.Name") when it is not torch's DataLoader itself

    def snippet(self) -> str:
        """Paste-ready code that makes the loader, of its own class, with the chosen settings."""
        return self.settings.snippet(self.loader_class)

    @property
    def settings(self) -> Settings:
        """The chosen settings."""
        return self.chosen.settings

    @property
    def speedup(self) -> float | None:
        """The chosen settings' rate over the baseline's (medians of their runs); None when the baseline
        delivered nothing to compare with."""
        before = self.baseline.batches_per_s
        return self.chosen.batches_per_s / before if before > 0 else None

    @property
    def limit_trial(self) -> Trial | None:
        """The trial whose runs measured the host's limit: the chosen one when it can (worker processes), else
        the usable trial with workers that ran most."""
        if self.chosen.limit_batches_per_s is not None:
            return self.chosen
        measured = [t for t in self.trials if t.usable and t.limit_batches_per_s is not None]
        return max(measured, key=lambda t: (len(t.runs), t.batches_per_s), default=None)

    def limit_dict(self) -> dict[str, Any] | None:
        """{"batches_per_s", "binds", "trial"}: the host's limit and the trial that measured it; None unknown."""
        trial = self.limit_trial
        if trial is None or trial.limit_batches_per_s is None:
            return None
        binds = [run.limit_binds for run in trial.runs if run.limit_binds]
        return {
            "batches_per_s": round(trial.limit_batches_per_s, 3),
            # the most runs' binds; of a tie, the earliest run's (not a set's order, which changes per process)
            "binds": max(binds, key=binds.count) if binds else None,
            "trial": trial.number,
            "note": self._limit_note(),
        }

    def _limit_note(self) -> str | None:
        """Why the choice can pass the limit: the limit counts the CPU of worker processes, which copy each
        batch into shared memory and out of it; threads do not (memory-heavy's 64 MB batches: 2 threads at
        130% of the limit 2 worker processes measured). None when the choice is within the limit."""
        share = self.share_of_limit(self.chosen)
        if share is None or share <= 1.0 or self.chosen.settings.backend != "thread":
            return None
        return (
            "measured with worker processes, whose CPU counts copying each batch between processes; threads copy none"
        )

    def share_of_limit(self, trial: Trial) -> float | None:
        limit = self.limit_trial
        if limit is None or not limit.limit_batches_per_s or not trial.runs:
            return None
        return trial.batches_per_s / limit.limit_batches_per_s

    @property
    def found(self) -> bool:
        """Whether any measured settings delivered batches (else every trial stalled, crashed or was refused)."""
        return self.chosen.usable and self.chosen.batches_per_s > 0

    def to_dict(self) -> dict[str, Any]:
        speedup = self.speedup
        return {
            "baseline": self.baseline.to_dict(),
            "chosen": self.chosen.to_dict(),
            "speedup": None if speedup is None else round(speedup, 3),
            "snippet": self.snippet(),
            "trials": [trial.to_dict() for trial in self.trials],
            "limits": dataclasses.asdict(self.limits),
            "search_s": round(self.seconds, 3),
            "stopped": self.stopped,
            "step_ms": None if self.step_ms is None else round(self.step_ms, 3),
            "loader_class": self.loader_class,
            "limit": self.limit_dict(),
            "share_of_limit": _rounded(self.share_of_limit(self.chosen)),
            "baseline_share_of_limit": _rounded(self.share_of_limit(self.baseline)),
        }

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> LoaderTuning:
        """The LoaderTuning of loader `name` whose to_dict() is `data`. Its baseline and chosen trial are the very
        Trials of its list that they were written from (the renderers tell them by identity), else rebuilt apart."""
        trials = field_of(data, "trials", list[Trial])

        def among_trials(key: str) -> Trial:
            same = (rebuilt for rebuilt, was in zip(trials, data["trials"], strict=True) if was == data.get(key))
            return next(same, None) or field_of(data, key, Trial)

        return dataclass_from_written(
            cls,
            data,
            {"search_s": "seconds"},
            name=name,
            trials=trials,
            baseline=among_trials("baseline"),
            chosen=among_trials("chosen"),
        )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass
class TuneReport:
    """A tune of a target's loaders (schema loaderdoctor.tune/1)."""

    target: str
    loaders: dict[str, LoaderTuning]
    # _repr_html_ (a notebook's view) and __str__ (the console text) are lent by commands/showing.py: render/ is above

    @property
    def exit_status(self) -> int:
        """0 when every loader has settings that delivered batches, 1 when one has none."""
        return 0 if all(tuning.found for tuning in self.loaders.values()) else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "target": self.target,
            "loaders": {name: tuning.to_dict() for name, tuning in self.loaders.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneReport:
        """The TuneReport whose to_dict() is `data`."""
        return dataclass_from_written(cls, data)
