"""Shared by the fault-injection tests: when a planted fault strikes."""

from __future__ import annotations

import os
from pathlib import Path


def strikes(marker: Path | str, *, arm_file: Path | str | None, once: bool) -> bool:
    """Whether the fault strikes now: only once `arm_file` exists (when given), and at most once over every
    process when `once` (the first to create `marker` wins)."""
    if arm_file is not None and not os.path.exists(arm_file):
        return False
    if not once:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True
