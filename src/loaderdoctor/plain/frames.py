"""A frame of a stack as plain data: where code ran, read by usercode.py to tell whose code it is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StackFrame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"
