"""A saved --json report of check, tune or scale, loaded back by its schema."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from loaderdoctor.errors import UsageError
from loaderdoctor.kinds import KINDS, AnyReport
from loaderdoctor.plain import jsontext as plainjson
from loaderdoctor.plain.data import PlainDataError, path_words, rebuilt_at
from loaderdoctor.report import SCHEMA as CHECK_SCHEMA

# Each schema's report class (kinds.py), which rebuilds it all (plaindata checks each field by its type hint on the
# way).
SCHEMAS: dict[str, Any] = {kind.schema: kind.report for kind in KINDS}
_SAVE_HINT = "save one with `loaderdoctor check --json > report.json` (or tune, or scale)"
_CHANGED_HINT = "it was changed after it was saved, or not saved by loaderdoctor; " + _SAVE_HINT
# No saved report comes near this size (a check's is about 100 KB; a long watched run's a few MB).
MAX_BYTES = 64 * 2**20


def read_report(path: Path) -> AnyReport:
    """The report that --json saved at `path`; a UsageError saying what is wrong when it cannot be loaded: not a
    regular file (a FIFO is never waited on, a device never read), over MAX_BYTES, not JSON, out of bounds."""
    raw = _read_bounded(path)
    try:
        data = plainjson.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not a saved report: it is not text (UTF-8)", hint=_SAVE_HINT) from None
    except json.JSONDecodeError as error:
        raise UsageError(
            f"{path} is not JSON: {error.msg} at line {error.lineno}, column {error.colno}", hint=_SAVE_HINT
        ) from None
    except PlainDataError as error:
        raise UsageError(f"{path} is not a valid report: {error}", hint=_CHANGED_HINT) from None
    return load_report(data, source=str(path))


def _read_bounded(path: Path) -> bytes:
    """The bytes of the regular file at `path`, at most MAX_BYTES: its kind checked before it is opened (and
    again once open, without blocking), so that a FIFO, a device or a socket is never read."""
    try:
        _bounded(path, os.stat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as file:
            _bounded(path, os.fstat(file.fileno()))
            raw = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"no saved report at {path}: the file does not exist", hint=_SAVE_HINT) from None
    except OSError as error:
        raise UsageError(f"cannot read the saved report {path}: {error.strerror or error}") from None
    _bounded(path, None, len(raw))
    return raw


def _bounded(path: Path, status: os.stat_result | None, size: int = 0) -> None:
    """Raise unless `status` is a regular file's, of MAX_BYTES at most (or, read, `size` is)."""
    if status is not None and not stat.S_ISREG(status.st_mode):
        kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (a named pipe)"), (stat.S_ISSOCK, "a socket")]
        kind = next((words for test, words in kinds if test(status.st_mode)), "a device")
        raise UsageError(f"{path} is not a saved report: it is {kind}, not a file", hint=_SAVE_HINT)
    if max(size, 0 if status is None else status.st_size) > MAX_BYTES:
        raise UsageError(
            f"{path} is not a saved report: it is larger than {MAX_BYTES // 2**20} MiB, the most a report is read to",
            hint=_SAVE_HINT,
        )


def load_report(data: dict[str, Any], source: str = "the saved report") -> AnyReport:
    """The check, tune or scale report whose to_dict() is `data`, by its "schema"; a UsageError naming `source`
    and what is wrong when `data` is not one."""
    if not isinstance(data, dict):
        raise UsageError(f"{source} is not a report: a report is a JSON object, not a {type(data).__name__}")
    schema = data.get("schema")
    if "error" in data and "loaders" not in data:
        raise UsageError(
            f"{source} holds an error, not a report: {data['error']}",
            hint="the command that wrote it failed; mend what the error says and run it again"
            + (f" ({data['hint']})" if data.get("hint") else ""),
        )
    if not isinstance(schema, str) or schema not in SCHEMAS:
        what = "no schema" if schema is None else f"the unknown schema {schema!r}"
        raise UsageError(
            f"{source} has {what}: it is not a report of check, tune or scale",
            hint=f"loaderdoctor loads the schemas {', '.join(SCHEMAS)}",
        )
    report_class = SCHEMAS[schema]
    loaders = data.get("loaders")
    if schema == CHECK_SCHEMA and isinstance(loaders, dict):
        _has_recordings(loaders, source)
    try:
        return rebuilt_at((), report_class.from_dict, data)
    except PlainDataError as error:
        raise UsageError(f"{source} is not a valid {schema} report: {error}", hint=_CHANGED_HINT) from None


def _has_recordings(loaders: dict[str, Any], source: str) -> None:
    """Raise unless every loader of a check report holds its recording: the renderers read it, and a report saved
    before reports kept it has its findings and measurements but none."""
    older = [
        name for name, lr in loaders.items() if isinstance(lr, dict) and "findings" in lr and "recording" not in lr
    ]
    if older:
        raise UsageError(
            f"{source} was saved by an older loaderdoctor: {path_words(('loaders', older[0]))} has no recording to "
            "show it from",
            hint="run `loaderdoctor check` again to save a report that loads back",
        )


def as_saved(report: AnyReport) -> AnyReport:
    """The report as it loads back from its JSON: what every renderer and tracker reads."""
    # NaN and infinity pass (the trip stays in this process); --json itself refuses them, as JSON has none.
    return load_report(json.loads(json.dumps(report.to_dict())))


# Where a report is shown on the console, longer strings are cut: rich takes a second to wrap a megabyte.
CONSOLE_CHARS = 4000


def for_console(report: AnyReport) -> AnyReport:
    """The report as the console shows it: every string longer than CONSOLE_CHARS cut, with a mark that says how
    long it was (the report itself when none is)."""
    data = report.to_dict()
    cut = _cut_strings(data)
    return report if cut is data else load_report(cut)


def _cut_strings(value: Any) -> Any:
    """`value` (plain data) with its long strings cut, keys too; `value` itself when it holds none."""
    if isinstance(value, str):
        if len(value) <= CONSOLE_CHARS:
            return value
        return f"{value[:CONSOLE_CHARS]}… [cut: {len(value):,} characters in all]"
    if isinstance(value, dict):
        pairs = [(_cut_strings(key), _cut_strings(item)) for key, item in value.items()]
        same = all(k is key and i is item for (k, i), (key, item) in zip(pairs, value.items(), strict=True))
        return value if same else dict(pairs)
    if isinstance(value, list):
        items = [_cut_strings(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
