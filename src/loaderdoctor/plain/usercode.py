"""Whose code a frame runs, found one way: the user's frame in a stack or a traceback, and exceptions described
at the place in the user's code that raised them."""

from __future__ import annotations

import functools
import os
import sysconfig
import traceback
from pathlib import Path
from types import TracebackType

import torch

from loaderdoctor.plain.frames import StackFrame

_OWN_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # the package's root
_SCENARIOS_DIR = _OWN_DIR + "scenarios" + os.sep
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_PACKAGE_DIRS = ("site-packages", "dist-packages")


def code_owner(filename: str) -> str:
    """Whose code a source file is: "user" (the user's own, and loaderdoctor's built-in scenarios, which play
    the user's part), "package" (an installed package the user chose), "python" (the standard library), or
    "internal" (loaderdoctor, torch, and code without a file such as "<frozen importlib._bootstrap>")."""
    if filename.startswith("<"):
        return "internal"
    path = os.path.realpath(filename)
    if path.startswith(_SCENARIOS_DIR):
        return "user"
    if path.startswith((_OWN_DIR, _TORCH_DIR)):
        return "internal"
    package_roots, python_roots = _library_roots()
    if _is_under(path, package_roots) or any(part in _PACKAGE_DIRS for part in Path(path).parts):
        return "package"
    if _is_under(path, python_roots):
        return "python"
    return "user"


def is_own_file(filename: str) -> bool:
    """Whether a source file is loaderdoctor's own code (its built-in scenarios play the user's part: not own)."""
    path = os.path.realpath(filename)
    return path.startswith(_OWN_DIR) and not path.startswith(_SCENARIOS_DIR)


def is_user_frame(frame: StackFrame) -> bool:
    """Whether a frame is the user's: their code or a library they chose, not Python, torch or loaderdoctor."""
    return code_owner(frame.file) in ("user", "package")


def innermost_user_frame(tb: TracebackType | None) -> tuple[str, int, str] | None:
    """The innermost (file, line, function) of a traceback in the user's own code; else outside loaderdoctor
    and torch; else any with a file."""
    frames = [(frame.f_code.co_filename, lineno, frame.f_code.co_name) for frame, lineno in traceback.walk_tb(tb)]
    real = [frame for frame in reversed(frames) if not frame[0].startswith("<")]
    owned = [(code_owner(frame[0]), frame) for frame in real]
    users = [frame for owner, frame in owned if owner == "user"]
    outside = [frame for owner, frame in owned if owner != "internal"]
    return next(iter(users + outside + real), None)


def describe_exception(exc: BaseException) -> str:
    """`exc` with where the user's code raised it: "ValueError: msg (at file.py:12 in fn)"."""
    if isinstance(exc, SyntaxError):
        text = f"{type(exc).__name__}: {exc.msg}" if exc.msg else type(exc).__name__
        return f"{text} (at {syntax_error_site(exc)})" if exc.filename else text
    message = str(exc).strip()
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    frame = innermost_user_frame(exc.__traceback__)
    if frame is None:
        return text
    filename, lineno, function = frame
    return f"{text} (at {display_path(filename)}:{lineno} in {function})"


def syntax_error_site(exc: SyntaxError) -> str:
    """Where a syntax error is: "file.py:3"."""
    return f"{display_path(exc.filename or '<unknown>')}:{exc.lineno}"


def user_site(exc: BaseException) -> str | None:
    """Where the user's code raised `exc` ("file.py:12"), or None when no frame of the traceback has a file."""
    frame = innermost_user_frame(exc.__traceback__)
    return f"{display_path(frame[0])}:{frame[1]}" if frame else None


def display_path(filename: str) -> str:
    """`filename` relative to the current directory when it lies under it, else as it is."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    outside = relative == os.pardir or relative.startswith(os.pardir + os.sep)
    return filename if outside else relative


@functools.cache
def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The installed packages' directories, and the standard library's."""
    paths = sysconfig.get_paths()

    def roots(*keys: str) -> tuple[str, ...]:
        return tuple(sorted({os.path.realpath(paths[key]) for key in keys if paths.get(key)}))

    return roots("purelib", "platlib"), roots("stdlib", "platstdlib")


def _is_under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)
