"""Words for counts and settings, so that every message says "1 worker" and "2 workers" the same way."""

from __future__ import annotations


def plural(count: int, noun: str, plural: str | None = None) -> str:
    """'1 worker', '2 workers', '1 batch', '3 batches' (or the plural given)."""
    if count == 1:
        return f"{count} {noun}"
    if plural is None:
        plural = noun + ("es" if noun.endswith(("s", "sh", "tch", "x")) else "s")  # batches, epochs
    return f"{count} {plural}"


def duration(seconds: float) -> str:
    """'850 ms', '12 s', '1 min 41 s', '2 h 31 min', '3 d 4 h': two units at most, the larger first."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def money(amount: float) -> str:
    """'$0.42', '$40', '$1,250': cents only below $100."""
    return f"${amount:,.2f}" if amount < 100 else f"${amount:,.0f}"


def percent(fraction: float) -> str:
    """A fraction in the words a title uses: '62%', or '0.4%' when it is small."""
    if fraction >= 0.01:
        return f"{fraction * 100:.0f}%"
    return f"{fraction * 100:.1f}%"
