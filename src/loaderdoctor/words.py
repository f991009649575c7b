"""Words for counts and settings, so that every message says "1 worker" and "2 workers" the same way."""

from __future__ import annotations


def plural(count: int, noun: str, plural: str | None = None) -> str:
    """'1 worker', '2 workers', '1 batch', '3 batches' (or the plural given)."""
    if count == 1:
        return f"{count} {noun}"
    if plural is None:
        plural = noun + ("es" if noun.endswith(("s", "sh", "tch", "x")) else "s")  # batches, epochs
    return f"{count} {plural}"
