"""The saved reports the tracker tests log (no worker starts): a check's, a tune's and a scale's, as
loaderdoctor wrote them (tests/unit/saved/)."""

from __future__ import annotations

from pathlib import Path

SAVED = Path(__file__).parents[2] / "saved"
# `loaderdoctor check demo --json` at a8c0f6b: loader 'train', input-bound (critical), its fix 4.295x faster
CHECK = SAVED / "check-a8c0f6b.json"
TUNE = SAVED / "tune-a0702f8.json"
SCALE = SAVED / "scale-a0702f8.json"
CHECK_TITLE = "The training step waits for data 63% of the time"
