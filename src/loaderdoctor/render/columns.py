"""Columns laid out from the console's width by the renderers themselves: each column as wide as its widest
cell, never squeezed or folded by rich, so that a table is printed whole or another layout is chosen."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

Justify = Literal["left", "right"]
Cell = str | Text
GAP = 2  # spaces between two columns


def cell_width(cell: Cell) -> int:
    """The columns a cell takes on a terminal (a wide character takes two)."""
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


def column_widths(rows: Sequence[Sequence[Cell]]) -> list[int]:
    """Each column's width: its widest cell (the header among them, as a row)."""
    return [max(cell_width(cell) for cell in column) for column in zip(*rows, strict=True)]


def line_width(widths: Sequence[int], gap: int = GAP) -> int:
    """The columns a line of these column widths takes, gaps included."""
    return sum(widths) + gap * max(len(widths) - 1, 0)


def line(
    cells: Sequence[Cell], widths: Sequence[int], justify: Sequence[Justify], gap: int = GAP, style: str | None = None
) -> Text:
    """One line of cells, each padded to its column's width, never wrapped, in `style` beneath the cells' own; the
    last cell not padded on the right (piped output keeps no trailing spaces)."""
    text = Text(style=style or "", no_wrap=True, overflow="ignore")
    last = len(cells) - 1
    for index, (cell, width, side) in enumerate(zip(cells, widths, justify, strict=True)):
        padding = " " * (width - cell_width(cell))
        piece = cell if isinstance(cell, Text) else Text(cell)
        if side == "right":
            text.append(padding)
        text.append_text(piece)
        if side == "left" and index < last:
            text.append(padding)
        if index < last:
            text.append(" " * gap)
    text.rstrip()
    return text


def wrapped_lines(text: str, width: int, console: Console) -> int:
    """How many lines rich wraps `text` into at `width` columns, breaking at spaces."""
    return len(Text(text).wrap(console, max(width, 1)))


def cut(text: str, width: int) -> str:
    """`text` in at most `width` columns: whole, or cut at the last space that leaves room for an ellipsis."""
    if cell_len(text) <= width:
        return text
    kept = text[: max(width - 1, 0)]
    while cell_len(kept) > width - 1:
        kept = kept[:-1]
    if " " in kept.strip():
        kept = kept[: kept.rstrip().rfind(" ")]
    return kept.rstrip(" ,;:") + "…"
