"""Verification: a fix measured against the original settings in windows taken in turns (probe/verify.py), and
its verdict, plain data."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.data import dataclass_from_written
from loaderdoctor.plain.numbers import rounded
from loaderdoctor.recording.record import OtherProcess, Recording

# What the measuring showed of a fix: faster (helps); quicker-start (its workers start far sooner, once per
# run, and it runs no slower: helps); as-fast (no slower, and the fix is about safety or cost, not speed:
# helps); no-gain (neither faster nor slower beyond the spread between windows); slower (slower
# in every pair of windows: not a fix); rescued (the original settings stalled or crashed, the fix delivered);
# failed (the fix stalled or crashed too); other-data (the fix delivered other samples: no rate compared);
# not-measured (cut short, or it could not run: no ratio).
VERDICTS = (
    "faster",
    "quicker-start",
    "as-fast",
    "no-gain",
    "slower",
    "rescued",
    "failed",
    "other-data",
    "not-measured",
)
HELPING = frozenset({"faster", "quicker-start", "as-fast", "rescued"})
# Verdicts that measured no rate of the fix on the same data as the original's.
NO_RATE = frozenset({"not-measured", "other-data", "failed"})

# Verification.to_dict's keys that name a field otherwise.
_VERIFICATION_KEYS = {
    "window_pairs": "pairs",
    "busy_window_pairs": "busy_pairs",
    "other_processes_cores": "other_cores",
    "ceiling_batches_per_s": "ceiling",
}


@dataclass
class Verification:
    """A fix measured against the original settings, in windows taken in turns (see probe/verify.py)."""

    settings: Settings
    before: float  # batches per second of an epoch of training with the user's settings (0 when not measured)
    after: float  # with the fix's settings
    before_outcome: str
    after_outcome: str
    verdict: str
    note: str
    after_recording: Recording | None = None
    # "rules": the findings' combined fix; "tune": the tuner's quick search found it; "lock-free": the same
    # settings with the workers' lock calls on read-only files made no-ops (a contended lock's cost measured)
    source: str = "rules"
    spread: tuple[float, float] | None = None  # the lowest and highest speedup of a pair of windows
    pairs: int = 0  # pairs of windows measured, one of each settings, that the speedup rests on
    busy_pairs: int = 0  # pairs measured while other processes took cores, left out (see verify.py)
    before_startup_s: float | None = None  # iter() to the first batch, once per run
    after_startup_s: float | None = None
    other_cores: float | None = None  # the most cores other processes took during a window
    other_processes: list[OtherProcess] = field(default_factory=list)
    # Every pair of windows was measured while other processes took cores: the speedup is this machine's under
    # that load, which can differ from a quiet machine's (the note says so).
    under_load: bool = False
    # Under that load the pairs' speedups differed too much for one fair figure (verdict.UNSTEADY_SPREAD): the note
    # gives the direction and the range, and no report shows the speedup as one figure.
    unsteady: bool = False
    # The loop's ceiling: its batches per second with the input taken away (the step on one batch, again and
    # again), measured in `ceiling_windows` windows in the same rounds (probe/datafree.py); None without a step.
    ceiling: float | None = None
    ceiling_windows: int = 0

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")

    @property
    def helped(self) -> bool:
        """Whether the fix is presented as one."""
        return self.verdict in HELPING

    def share_of_ceiling(self, rate: float | None) -> float | None:
        """`rate` (the fix's, or the original's) as a share of the loop's ceiling; None without either."""
        return rate / self.ceiling if rate and self.ceiling else None

    @property
    def fixed_share_of_ceiling(self) -> float | None:
        """The fix's rate as a share of the loop's ceiling, where the fix has a rate on the same data."""
        return self.share_of_ceiling(None if self.verdict in NO_RATE else self.after)

    @property
    def speedup(self) -> float | None:
        """after / before, when both were measured on the same data; never for a run cut short."""
        if self.verdict in NO_RATE or self.before <= 0:
            return None
        return self.after / self.before

    def to_dict(self) -> dict[str, Any]:
        speedup = self.speedup
        return {
            "settings": self.settings.to_dict(),
            "before": round(self.before, 3),
            "after": round(self.after, 3),
            "speedup": None if speedup is None else round(speedup, 3),
            "verdict": self.verdict,
            "helped": self.helped,
            "spread": None if self.spread is None else [round(self.spread[0], 3), round(self.spread[1], 3)],
            "window_pairs": self.pairs,
            "busy_window_pairs": self.busy_pairs,
            "before_outcome": self.before_outcome,
            "after_outcome": self.after_outcome,
            "before_startup_s": rounded(self.before_startup_s, 3),
            "after_startup_s": rounded(self.after_startup_s, 3),
            "other_processes_cores": rounded(self.other_cores, 3),
            "other_processes": [dataclasses.asdict(p) for p in self.other_processes],
            "under_load": self.under_load,
            "unsteady": self.unsteady,
            "note": self.note,
            "source": self.source,
            "ceiling_batches_per_s": rounded(self.ceiling, 3),
            "ceiling_windows": self.ceiling_windows,
            "share_of_ceiling": rounded(self.fixed_share_of_ceiling, 3),
            "before_share_of_ceiling": rounded(self.share_of_ceiling(self.before), 3),
            "after_recording": None if self.after_recording is None else self.after_recording.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verification:
        """The Verification whose to_dict() is `data` (its speedup, helped, share_of_limit and shares of the ceiling
        recomputed)."""
        return dataclass_from_written(cls, data, _VERIFICATION_KEYS)
