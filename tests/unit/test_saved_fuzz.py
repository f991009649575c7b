"""A saved report changed at any one field (each wrong type, NaN, infinity, a huge number, deep nesting) either
shows as a report (exit 0: console, --json and --html) or is refused with exit 2 and the field's path; never a
traceback, never another status."""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_report_roundtrip import _check_report, _scale_report, _tune_report

from loaderdoctor.cli import main
from loaderdoctor.plain.data import path_words

REPORTS = {"check": _check_report, "tune": _tune_report, "scale": _scale_report}
# Each wrong type, in an order where no two neighbours are of one JSON kind (two numbers): a field given two
# neighbours gets at least one type it is not. Then values that JSON can write only as bare words, which the JSON
# text gets in place of the marker string (NaN, infinity, a number of 5000 digits, a value nested 200 deep).
WRONG_TYPES: list[Any] = [None, 0, "x", True, [1, "x"], 0.5, {"x": 1}]
# Every mutation at every field, with LOADERDOCTOR_FUZZ=all (minutes), rather than a deterministic share.
EVERY = os.environ.get("LOADERDOCTOR_FUZZ") == "all"
_MARKER = "\u2063mutated\u2063"
BARE_WORDS = ["NaN", "-Infinity", "1" + "0" * 5000, "1e999", "9" * 30, "[" * 200 + "]" * 200]
# Each field is mutated at its first occurrence, and this many other occurrences (another loader's, a later item
# of a list) are sampled, deterministically.
OTHER_OCCURRENCES = 20


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into `value` (a JSON document), the document's own excluded."""
    items: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    for key, item in items:
        yield (*path, key)
        yield from _paths(item, (*path, key))


def _field(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """The field a path leads to, whatever loader or list item: ("loaders", "*", "recording", "batches", "*", ...)."""
    return tuple("*" if isinstance(key, int) or path[:at] == ("loaders",) else key for at, key in enumerate(path))


def _fields_paths(document: dict[str, Any]) -> list[tuple[Any, ...]]:
    """One path per field (its first occurrence), and OTHER_OCCURRENCES more."""
    first: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    others: list[tuple[Any, ...]] = []
    for path in _paths(document):
        if _field(path) not in first:
            first[_field(path)] = path
        else:
            others.append(path)
    sample = random.Random(33).sample(others, min(len(others), OTHER_OCCURRENCES))
    return [*first.values(), *sample]


def _with(document: Any, path: tuple[Any, ...], value: Any) -> str:
    """The JSON text of `document` with the value at `path` replaced (the document itself left as it was)."""
    inner = document
    for key in path[:-1]:
        inner = inner[key]
    was = inner[path[-1]]
    inner[path[-1]] = value
    try:
        return json.dumps(document)
    finally:
        inner[path[-1]] = was


def _mutations(document: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], str, str]]:
    """(path, what was put there, the JSON text) for each mutation: each field given 2 of the wrong types in turn
    (field n the types 2n and 2n+1: every type as often, at least one a type the field is not) and one of the bare
    words; all of them at every field with LOADERDOCTOR_FUZZ=all (minutes)."""
    for number, path in enumerate(_fields_paths(document)):
        some = range(len(WRONG_TYPES)) if EVERY else range(2 * number, 2 * number + 2)
        for value in (WRONG_TYPES[n % len(WRONG_TYPES)] for n in some):
            yield path, repr(value), _with(document, path, value)
        for bare in BARE_WORDS if EVERY else [BARE_WORDS[number % len(BARE_WORDS)]]:
            text = _with(document, path, _MARKER).replace(json.dumps(_MARKER), bare)
            yield path, bare[:12], text


def _names(line: str, path: tuple[Any, ...]) -> bool:
    """Whether an error line refuses the report at `path`: at the field itself, within the value put there, or at
    the object whose own check refused the field's value ("loaders.val.findings[0]: unknown severity 'x'")."""
    if not line.startswith("error: "):
        return False
    if path == ("schema",):
        return "schema" in line
    named = [path_words(path), *([path_words(path[:-1])] if len(path) > 1 else [])]
    return any(re.search(rf"(^|\s){re.escape(at)}([:\s.\[]|$)", line) for at in named)


def _report(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str, str, str]:
    """`loaderdoctor report ...` in this process: its status (or the exception that escaped it), out and err."""
    try:
        status: int | str = main(argv)
    except Exception as error:  # any escape is what this test looks for
        status = f"{type(error).__name__}: {str(error)[:200]}"
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.timeout(1800 if EVERY else 180)
@pytest.mark.parametrize("kind", list(REPORTS))
def test_any_one_field_changed_is_shown_or_refused_with_its_path(kind, tmp_path: Path, capsys):
    document = json.loads(json.dumps(REPORTS[kind]().to_dict()))
    saved, page = tmp_path / "saved.json", tmp_path / "page.html"
    failures, counts = [], {"shown": 0, "refused": 0}
    for path, put, text in _mutations(document):
        saved.write_text(text)
        status, out, err = _report(["report", str(saved), "--html", str(page)], capsys)
        if status == 0:
            status, out, err = _report(["report", str(saved), "--json"], capsys)
            if status == 0:
                counts["shown"] += 1
                json.loads(out)  # --json prints JSON, and only JSON
                continue
        if status == 2 and _names(err.splitlines()[0], path):
            counts["refused"] += 1
            continue
        failures.append(f"{path_words(path)} = {put}: {status}: {err.strip()[:300]}")
    assert not failures, f"{len(failures)} mutations of {sum(counts.values()) + len(failures)}:\n" + "\n".join(
        failures[:40]
    )
    assert counts["shown"] and counts["refused"]
