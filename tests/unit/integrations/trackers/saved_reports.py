"""The saved reports the tracker tests log (no worker starts): a check's, a tune's and a scale's, as
loaderdoctor wrote them (tests/unit/saved/)."""

from __future__ import annotations

from pathlib import Path

SAVED = Path(__file__).parents[2] / "saved"
# `loaderdoctor check demo --json` at a8c0f6b: loader 'train', input-bound (critical), its fix 4.295x faster. Its
# measurements are computed anew from its recording: the loader loads in the loop's own thread (num_workers=0),
# whose 29 ms descheduled in each next() was loading's time (issue 49), so its wait reads 85%, not the 63% saved
# (the finding's title, saved with it, stays as it was written).
CHECK = SAVED / "check-a8c0f6b.json"
TUNE = SAVED / "tune-a0702f8.json"
SCALE = SAVED / "scale-a0702f8.json"
CHECK_TITLE = "The training step waits for data 63% of the time"
