"""Imports the module or file a TARGET names and finds its function there, with errors in the user's words."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from loaderdoctor import scenarios
from loaderdoctor.errors import UsageError
from loaderdoctor.plain.usercode import describe_exception, display_path, syntax_error_site, user_site

_FORMS = "expected MODULE:FUNCTION or path/to/file.py:FUNCTION"
_EXAMPLE = "e.g. mypkg.data:make_loaders or train.py:make_loaders, a function taking no arguments"
_MAX_LISTED = 8


# --- the TARGET string ---------------------------------------------------------------------------------------


def split_target(target: str) -> tuple[str, str]:
    """MODULE and FUNCTION of a "MODULE:FUNCTION" TARGET, or a UsageError saying how to write one."""
    module_part, colon, fn_name = target.rpartition(":")
    module_part, fn_name = module_part.strip(), fn_name.strip()
    if not colon or not module_part or not fn_name:
        raise UsageError(f"bad target {target!r}: {_FORMS}", hint=_split_hint(target, colon, module_part))
    if not fn_name.isidentifier():
        raise UsageError(
            f"bad target {target!r}: {fn_name!r} is not a function name",
            hint="after the colon, name a function defined at the top level of the module, without "
            "parentheses or arguments: MODULE:FUNCTION",
        )
    return module_part, fn_name


def _split_hint(target: str, colon: str, module_part: str) -> str:
    if not target:
        return f"give a target, {_EXAMPLE}, or scenario:NAME for a built-in scenario"
    if not colon:
        if target in scenarios.names():
            return f"to run the built-in scenario, write scenario:{target}"
        if is_path(target):
            return f"name the function in it that returns the loaders: {target}:FUNCTION"
        return f"{_EXAMPLE}, or scenario:NAME for a built-in scenario"
    if not module_part:
        return f"name the module or the .py file before the colon, {_EXAMPLE}"
    return f"name the function that returns the loaders after the colon: {module_part}:FUNCTION"


def is_path(module_part: str) -> bool:
    """Whether the part before the colon names a file (path/to/file.py) rather than a module."""
    separators = [sep for sep in (os.sep, os.altsep, "/") if sep]
    return module_part.endswith(".py") or any(sep in module_part for sep in separators)


# --- importing the user's module -----------------------------------------------------------------------------


def import_module(name: str) -> ModuleType:
    """The module `name`, imported with the current directory on sys.path, or a UsageError."""
    if name.startswith(".") or "" in name.split("."):
        raise UsageError(
            f"{name!r} is not a module name",
            hint="give an absolute dotted name such as mypkg.data, or a file path such as src/data.py",
        )
    _ensure_cwd_on_path()
    importlib.invalidate_caches()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise _module_not_found(name, exc.name) from None
        raise _import_error(f"module {name!r}", exc) from exc
    except (Exception, SystemExit) as exc:
        raise _import_error(f"module {name!r}", exc) from exc


def _ensure_cwd_on_path() -> None:
    # `python -m` puts the current directory first on sys.path; a console script does not.
    cwd = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path):
        sys.path.insert(0, cwd)


def _module_not_found(name: str, missing: str) -> UsageError:
    detail = "" if missing == name else f" (there is no module {missing!r})"
    pythonpath = os.environ.get("PYTHONPATH") or "unset"
    return UsageError(
        f"no module named {name!r}{detail} in the current directory ({os.getcwd()}), on PYTHONPATH "
        f"({pythonpath}) or among the installed packages",
        hint=f"run loaderdoctor from the directory that contains {missing.split('.')[0]}, add that directory "
        f"to PYTHONPATH, or give a file path instead: path/to/{name.split('.')[-1]}.py:FUNCTION",
    )


def import_file(path_text: str) -> ModuleType:
    """The .py file at `path_text`, imported by its name with its directory first on sys.path, or a UsageError."""
    path = Path(path_text).expanduser()
    if not path.exists():
        raise UsageError(
            f"no file {path_text!r} (relative to the current directory {os.getcwd()})",
            hint="check the path; a relative path is taken from the directory loaderdoctor runs in",
        )
    if path.is_dir():
        raise UsageError(
            f"{path_text!r} is a directory, not a Python file",
            hint="give the .py file that defines the function: path/to/file.py:FUNCTION",
        )
    if path.suffix != ".py":
        raise UsageError(
            f"{path_text!r} is not a .py file",
            hint="give a Python source file (path/to/file.py:FUNCTION) or a module name (pkg.mod:FUNCTION)",
        )
    path = path.resolve()
    name = path.stem
    if "." in name:
        raise UsageError(
            f"cannot import {path_text!r}: the dot in {name!r} would make Python read it as a package",
            hint=f"rename the file, e.g. to {name.replace('.', '_')}.py",
        )
    existing = sys.modules.get(name)
    if existing is not None and _is_file_of(existing, path):
        return existing  # imported before: running its top-level code twice would make its classes differ
    taken_by = _name_taken_by(name, path)
    if taken_by is not None:
        raise _name_taken(path_text, name, taken_by)
    directory = str(path.parent)
    if not sys.path or sys.path[0] != directory:
        sys.path.insert(0, directory)
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(name)
    except (Exception, SystemExit) as exc:
        raise _import_error(path_text, exc) from exc
    if not _is_file_of(module, path):
        raise _name_taken(path_text, name, _origin(module))
    return module


def _name_taken_by(name: str, path: Path) -> str | None:
    """Where another module called `name` (imported, or importable now) comes from, else None."""
    existing = sys.modules.get(name)
    if existing is not None:
        return None if _is_file_of(existing, path) else _origin(existing)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    # a namespace package (no origin) never wins over a module file, so it does not count
    if spec is None or spec.origin is None or _same_path(spec.origin, path):
        return None
    return spec.origin if spec.has_location else f"Python's {spec.origin} module {name!r}"


def _name_taken(path_text: str, name: str, taken_by: str) -> UsageError:
    return UsageError(
        f"cannot import {path_text!r} as the module {name!r}: that name is taken by {taken_by}",
        hint=f"rename the file (e.g. to {name}_loaders.py): loaderdoctor imports it by its name so that "
        "worker processes can import the classes defined in it",
    )


def _origin(module: ModuleType) -> str:
    filename = getattr(module, "__file__", None)
    return filename if filename else f"Python's built-in module {module.__name__!r}"


def _is_file_of(module: ModuleType, path: Path) -> bool:
    filename = getattr(module, "__file__", None)
    return bool(filename) and _same_path(filename, path)


def _same_path(filename: str, path: Path) -> bool:
    try:
        return os.path.samefile(filename, path)
    except OSError:
        return False


def _import_error(label: str, exc: BaseException) -> UsageError:
    """A UsageError for `exc`, raised while importing the user's module called `label`."""
    at = user_site(exc)
    where = f" (at {at})" if at else ""
    if isinstance(exc, SyntaxError):
        site = syntax_error_site(exc)
        return UsageError(
            f"syntax error in {site}: {exc.msg}",
            hint=f"fix it; `python -m py_compile {site.rpartition(':')[0]}` checks a file without running it",
        )
    if isinstance(exc, ModuleNotFoundError):
        missing = exc.name or str(exc)
        return UsageError(
            f"importing {label} failed: it needs the module {missing!r}, which is not installed "
            f"(imported at {at or 'an unknown place'})",
            hint=f"install the package that provides {missing.split('.')[0]!r} into the Python environment "
            f"loaderdoctor runs in ({sys.executable}), or run loaderdoctor from your training environment",
        )
    if isinstance(exc, ImportError):
        if "relative import" in str(exc):
            hint = "the file is part of a package: give it as pkg.module:FUNCTION from the project's root"
        else:
            hint = "fix that import in your module, or install the version of the package it expects"
        return UsageError(f"importing {label} failed: {exc}{where}", hint=hint)
    if isinstance(exc, SystemExit):
        return UsageError(
            f"importing {label} called sys.exit({exc.code!r}){where}",
            hint='importing a module runs its top-level code: put the script part under `if __name__ == "__main__":`',
        )
    return UsageError(
        f"importing {label} raised {describe_exception(exc)}",
        hint="importing a module runs its top-level code: fix the error, or move the failing code into a function",
    )


# --- the function --------------------------------------------------------------------------------------------


def find_function(module: ModuleType, label: str, fn_name: str) -> Any:
    """The attribute `fn_name` of `module` (called `label`), or a UsageError naming the functions it has."""
    try:
        return getattr(module, fn_name)
    except AttributeError:
        raise _missing_function(module, label, fn_name) from None


def _missing_function(module: ModuleType, label: str, fn_name: str) -> UsageError:
    public = {name: value for name, value in vars(module).items() if not name.startswith("_")}
    callables = sorted(name for name, value in public.items() if callable(value))
    defined_here = [name for name in callables if getattr(public[name], "__module__", None) == module.__name__]
    close = difflib.get_close_matches(fn_name, callables, n=3, cutoff=0.6)
    candidates = close + [name for name in defined_here if name not in close]
    listed = candidates[:_MAX_LISTED]
    filename = getattr(module, "__file__", None)
    where = label if label.endswith(".py") or not filename else f"{label} ({display_path(filename)})"
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    if listed:
        more = ", ..." if len(candidates) > len(listed) else ""
        hint = f"{suggestion}functions defined there: {', '.join(listed)}{more}"
    else:
        hint = "it defines no public functions: add one that takes no arguments and returns the loaders"
    return UsageError(f"{where} has no function {fn_name!r}", hint=hint)
