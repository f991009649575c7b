"""Numbers as reports write them: sizes in MiB, and figures rounded with None kept as None."""

from __future__ import annotations

MIB = 2**20


def rounded(value: float | None, digits: int) -> float | None:
    """`value` rounded to `digits`, None when there is no value."""
    return None if value is None else round(value, digits)
