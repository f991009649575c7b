"""HTML reports: one self-contained page per report (check, tune, scale: render/kinds.py picks it) or history run,
written to a file."""

from __future__ import annotations

from pathlib import Path

from loaderdoctor.errors import UsageError


def write_page(page: str, path: Path) -> None:
    """Write a page to `path`, with a clear error where it cannot be written."""
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as error:
        raise UsageError(
            f"cannot write the HTML report to {path}: {error.strerror or error}",
            hint="give --html a file in a folder that exists and that you may write to",
        ) from None
