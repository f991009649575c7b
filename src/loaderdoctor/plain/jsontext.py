"""JSON text read into plain data within bounds (no NaN or infinity, no number beyond 64 bits, no nesting deeper
than a report's), what is out of bounds refused with its path."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from loaderdoctor.plain.data import Path, PlainDataError

# Three times as deep as any report loaderdoctor writes (a check report's stack frames are 9 keys deep).
MAX_DEPTH = 32
# No figure loaderdoctor writes comes near a 64-bit integer (the history's ids are such integers, too).
MAX_NUMBER = 2**63


class _OutOfBounds:
    """A value the parser met out of bounds, held in its place until the walk that knows its path refuses it."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


def loads(text: str) -> Any:
    """`text` parsed as JSON: json.JSONDecodeError when it is none, PlainDataError (with the path) for a value
    out of bounds."""
    try:
        data = json.loads(text, parse_constant=_constant, parse_int=_int, parse_float=_float)
    except RecursionError:
        raise PlainDataError(f"it is nested far deeper than a report ({MAX_DEPTH} levels at most)") from None
    _refuse_out_of_bounds(data)
    return data


def _constant(name: str) -> _OutOfBounds:
    return _OutOfBounds(f"{name} is no number (JSON has none)")


def _int(text: str) -> int | _OutOfBounds:
    digits = text.lstrip("-")
    if len(digits) > len(str(MAX_NUMBER)) or abs(int(text)) >= MAX_NUMBER:
        return _OutOfBounds(f"a number of {len(digits)} digits is out of range (up to {MAX_NUMBER - 1})")
    return int(text)


def _float(text: str) -> float | _OutOfBounds:
    number = float(text)
    if not math.isfinite(number) or abs(number) >= MAX_NUMBER:
        shown = text if len(text) <= 24 else f"{text[:12]}…{text[-8:]}"
        return _OutOfBounds(f"the number {shown} is out of range (up to {MAX_NUMBER - 1})")
    return number


def _refuse_out_of_bounds(data: Any) -> None:
    """Raise PlainDataError at the first value out of bounds, or the first nested deeper than MAX_DEPTH. The walk
    is iterative (no recursion however deep the data), and keeps paths only to name the one refused."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, _OutOfBounds):
            raise PlainDataError(value.problem, _path_to(data, lambda found, _, bad=value: found is bad))
        if isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise PlainDataError(f"nested deeper than {MAX_DEPTH} levels", _path_to(data, _too_deep))
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))


def _too_deep(value: Any, path: Path) -> bool:
    return isinstance(value, dict | list) and len(path) >= MAX_DEPTH


def _path_to(data: Any, sought: Callable[[Any, Path], bool]) -> Path:
    """The path of the first value in `data` (in the document's order) that `sought(value, path)` is true of."""
    stack: list[tuple[Any, Path]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if sought(value, path):
            return path
        if isinstance(value, dict | list) and len(path) < MAX_DEPTH:
            items = list(value.items() if isinstance(value, dict) else enumerate(value))
            stack.extend((item, (*path, key)) for key, item in reversed(items))
    return ()
