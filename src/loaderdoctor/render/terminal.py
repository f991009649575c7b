"""The console every report is printed through: control characters in the text it shows (a loader's or a
dataset's name, an exception's message, a saved report, a history row, another process's name) are made
visible, so that untrusted text never reaches the terminal raw (no title change, no screen clear)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from rich.console import Console
from rich.segment import Segment

# C0 controls but the newline and the tab, DEL, and C1 controls (a terminal reads 0x9b as ESC [).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with each control character written as its escape ("\\x1b"), newlines and tabs kept."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found[0]):02x}", text)


class SafeConsole(Console):
    """A rich Console whose text segments are made visible (see visible()) as they are rendered; rich's own
    styles and cursor controls pass as they are. One place, whatever renderer built the text."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(visible(segment.text), segment.style, segment.control)
            for segment in buffer
        )


class VisibleFormatter(logging.Formatter):
    """Log records (the command line's warnings among them) formatted with control characters made visible: a
    record's message and arguments carry untrusted text (a loader's name, an exception's message)."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))
