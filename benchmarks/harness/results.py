"""What a benchmark takes and gives: its arguments, the table it prints, and its results kept as JSON with the
machine's facts (`--json PATH`), so that two runs can be compared (harness/compare.py)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any


def parser(doc: str, *, rounds: int | None = None, rounds_as: str = "--rounds") -> argparse.ArgumentParser:
    """A benchmark's arguments: its docstring as help, `--json PATH`, and with `rounds` its count of rounds under
    the name it has always had (`--rounds N`, or a positional one such as `ROUNDS`), read as `args.rounds`."""
    first, _, rest = doc.partition("\n")
    made = argparse.ArgumentParser(
        description=first, epilog=rest.strip(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    made.add_argument("--json", type=Path, metavar="PATH", help="also write the results, with the machine's facts")
    if rounds is not None and rounds_as.startswith("--"):
        made.add_argument(rounds_as, dest="rounds", type=int, default=rounds, help=f"(default {rounds})")
    elif rounds is not None:
        made.add_argument("rounds", metavar=rounds_as, type=int, nargs="?", default=rounds, help=f"(default {rounds})")
    return made


def shown(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    """A figure as the tables print it: "-" where nothing was measured."""
    return "-" if value is None else f"{value:{fmt}}{suffix}"


@dataclass
class Column:
    """One column of a table: its title, width and alignment, how a figure in it is written (`fmt`, then `suffix`:
    ".2f" and "x" print 1.23x; a string is printed as it is), `gap` more spaces before it than between the others,
    and the key its figures have in the JSON (`key`, by default the title in snake case)."""

    title: str
    width: int = 0
    fmt: str = ""
    suffix: str = ""
    align: str = ">"
    gap: int = 0
    key: str = ""

    def __post_init__(self) -> None:
        self.key = self.key or re.sub(r"[^a-z0-9]+", "_", self.title.lower()).strip("_")

    def cell(self, value: object) -> str:
        text = shown(value, self.fmt, self.suffix) if value is None or isinstance(value, float | int) else str(value)
        return " " * self.gap + f"{text:{self.align}{self.width}}"


class Table:
    """A table printed row by row as the figures come: its header (and a rule under it), then each row, flushed;
    `markdown` prints `| a | b |` rows under a `| --- |` rule."""

    def __init__(self, columns: Sequence[Column], *, sep: str = " ", rule: bool = True, markdown: bool = False):
        self.columns, self.sep, self.rule, self.markdown = list(columns), sep, rule, markdown

    def line(self, cells: Sequence[str]) -> str:
        return f"| {' | '.join(cells)} |" if self.markdown else self.sep.join(cells)

    def header(self, *more: Sequence[str]) -> None:
        """Prints the titles, and under them each of `more` lines of titles (a unit under each, say)."""
        heading = self.line(self._titles([c.title for c in self.columns]))
        print(heading)
        for titles in more:
            print(self.line(self._titles(titles)))
        if self.markdown:
            print(self.line(["---"] * len(self.columns)))
        elif self.rule:
            print("-" * len(heading))

    def _titles(self, titles: Sequence[str]) -> list[str]:
        return [" " * c.gap + f"{title:{c.align}{c.width}}" for c, title in zip(self.columns, titles, strict=True)]

    def row(self, *values: object, note: str = "") -> dict[str, object]:
        """Prints one row (`note` after its last column); its figures by their columns' keys, for the results."""
        cells = [column.cell(value) for column, value in zip(self.columns, values, strict=True)]
        print(self.line(cells) + note, flush=True)
        return {column.key: value for column, value in zip(self.columns, values, strict=True)}


# The tool's ceiling against a plain loop's (harness.ceiling_against_plain gives a row's figures)
CEILING_COLUMNS = (
    Column("tool ceiling", 12, ".1f", gap=1),
    Column("plain", 8, ".1f", key="plain_ceiling"),
    Column("ratio", 6, ".2f"),
    Column("tool cost", 9, ".0f", "%", gap=2, key="tool_cost_pct"),
    Column("plain", 6, ".0f", "%", key="plain_cost_pct"),
    Column("points", 6, "+.1f"),
)


class OverheadTable(Table):
    """The table of what a wrapper costs a loop, kept in `results`: each row's label, the plain and the other
    loop's rates in `unit`, the median of the per-round ratios other/plain, and the microseconds added per batch
    or sample."""

    def __init__(self, results: Results, label: str, width: int, unit: str, other: str) -> None:
        rates = [Column(f"plain {unit}", 16, ".0f", key="plain"), Column(f"{other} {unit}", 18, ".0f", key=other)]
        super().__init__([Column(label, width, align="<"), *rates, Column(f"{other}/plain", 14, ".3f", key="ratio"),
                          Column("us added", 9, ".1f")])  # fmt: skip
        self.results, self.other = results, other

    def add(self, label: str, plain: float, other: float, ratio: float) -> None:
        """Prints and keeps one row: `plain` and `other` rates and the median `ratio` of their rounds."""
        self.results.add(**self.row(label, plain, other, ratio, (1 / other - 1 / plain) * 1e6))
        self.results.figures[f"{label}: {self.other}/plain"] = ratio


def machine_facts() -> dict[str, Any]:
    """The machine a run measured: loaderdoctor's own snapshot of the host (cores, load average, memory, Python,
    torch), with the CPU's model, the platform and loaderdoctor's version."""
    from loaderdoctor import __version__
    from loaderdoctor.host.snapshot import take_snapshot

    facts = take_snapshot().to_dict()
    facts.pop("other_processes", None)  # filled by a run's end; a benchmark measures none
    system = f"{platform.system()}-{platform.release()}-{platform.machine()}"  # platform.platform() runs `uname -p`
    return {**facts, "cpu_model": _cpu_model(), "platform": system, "loaderdoctor_version": __version__}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class Results:
    """One run of a benchmark as JSON: its name, arguments and rounds, the machine's facts (the load average at its
    start and its end), each row it measured, and its headline figures by label (its ratios, mostly: what
    harness/compare.py sets beside another run's). Used as a `with` block: written to `--json PATH` at the block's
    end, when it ends without an error."""

    def __init__(self, script: str, args: argparse.Namespace, rounds: int | None = None) -> None:
        self.benchmark = Path(script).stem
        self.arguments = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        self.rounds = rounds if rounds is not None else getattr(args, "rounds", None)
        self.path: Path | None = args.json
        self.rows: list[dict[str, Any]] = []
        self.figures: dict[str, float | None] = {}
        self.started, self._clock = _now(), time.monotonic()
        self.machine = machine_facts() if self.path else {}

    def add(self, **row: Any) -> None:
        """Keeps one row of figures."""
        self.rows.append(row)

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "arguments": self.arguments,
            "rounds": self.rounds,
            "started": self.started,
            "ended": _now(),
            "seconds": round(time.monotonic() - self._clock, 1),
            "machine": {**self.machine, "load_avg_at_end": [round(load, 2) for load in os.getloadavg()]},
            "figures": self.figures,
            "rows": self.rows,
        }

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")
        print(f"results: {self.path}")

    def __enter__(self) -> Results:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.write()
