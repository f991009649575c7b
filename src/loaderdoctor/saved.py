"""A saved --json report of check, tune or scale, loaded back by its schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loaderdoctor.errors import LoaderDoctorError, UsageError
from loaderdoctor.report import SCHEMA as CHECK_SCHEMA
from loaderdoctor.report import LoaderReport, Report
from loaderdoctor.scale.report import SCHEMA as SCALE_SCHEMA
from loaderdoctor.scale.report import ScaleLoaderReport, ScaleReport
from loaderdoctor.tune.result import SCHEMA as TUNE_SCHEMA
from loaderdoctor.tune.result import LoaderTuning, TuneReport

AnyReport = Report | TuneReport | ScaleReport

# Each schema's report and loader classes: the report rebuilds it all, a loader's class names the loader at fault.
SCHEMAS: dict[str, tuple[Any, Any]] = {
    CHECK_SCHEMA: (Report, LoaderReport),
    TUNE_SCHEMA: (TuneReport, LoaderTuning),
    SCALE_SCHEMA: (ScaleReport, ScaleLoaderReport),
}
# What a document that is not what its schema says raises while it is rebuilt.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, LoaderDoctorError)
_SAVE_HINT = "save one with `loaderdoctor check --json > report.json` (or tune, or scale)"


def read_report(path: Path) -> AnyReport:
    """The report that --json saved at `path`; a UsageError saying what is wrong when it cannot be loaded."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"no saved report at {path}: the file does not exist", hint=_SAVE_HINT) from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not a saved report: it is not text (UTF-8)", hint=_SAVE_HINT) from None
    except OSError as error:
        raise UsageError(f"cannot read the saved report {path}: {error.strerror or error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(
            f"{path} is not JSON: {error.msg} at line {error.lineno}, column {error.colno}", hint=_SAVE_HINT
        ) from None
    return load_report(data, source=str(path))


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
    report_class, loader_class = SCHEMAS[schema]
    loaders = data.get("loaders")
    if schema == CHECK_SCHEMA and isinstance(loaders, dict):
        _has_recordings(loaders, source)
    try:
        return report_class.from_dict(data)
    except _MALFORMED as error:
        raise UsageError(
            f"{source} is not a valid {schema} report: {_at_fault(loaders, loader_class, error)}",
            hint="it was changed after it was saved, or not saved by loaderdoctor; " + _SAVE_HINT,
        ) from None


def _has_recordings(loaders: dict[str, Any], source: str) -> None:
    """Raise unless every loader of a check report holds its recording: the renderers read it, and a report saved
    before reports kept it has none."""
    lacking = [name for name, loader in loaders.items() if isinstance(loader, dict) and "recording" not in loader]
    if lacking:
        raise UsageError(
            f"{source} was saved by an older loaderdoctor: loader {lacking[0]!r} has no recording to show it from",
            hint="run `loaderdoctor check` again to save a report that loads back",
        )


def _at_fault(loaders: Any, loader_class: Any, error: Exception) -> str:
    """What `error` says is wrong, with the first loader that cannot be rebuilt when one is to blame."""
    if isinstance(loaders, dict):
        for name, loader in loaders.items():
            try:
                loader_class.from_dict(name, loader)
            except _MALFORMED as at_fault:
                return f"loader {name!r}: {_words(at_fault)}"
    return _words(error)


def _words(error: Exception) -> str:
    """An error raised while rebuilding a report, in words."""
    if isinstance(error, KeyError):
        return f"the key {error.args[0]!r} is missing"
    if isinstance(error, LoaderDoctorError):
        return error.message
    return str(error)
