"""Where a thread is, as a site in the user's code: the innermost frame of the user's code and, when the call in
progress there is a lock, which lock it is, found from what is really called.

The call in progress is the frame's last instruction (a call, or the entry of a `with`); its source span
(code.co_positions()) is parsed with ast for the callee expression, which is resolved through the frame's
locals, globals and builtins with name lookups and static attribute lookups only (inspect.getattr_static: no
property, __getattr__ or call of the user's runs), and compared with the lock functions and types themselves:
`from fcntl import flock as lock_file` is known as fcntl.flock, and `with self.lock:` as the lock it holds.
Inner frames in a lock library (filelock, multiprocessing's locks, threading's waits) name the lock as that
library's call; the site is then the frame of the user's code that called it. Parsing is cached per code
object and instruction, so that a sample stays cheap.
"""

from __future__ import annotations

import _thread
import ast
import dis
import inspect
import linecache
import multiprocessing.queues
import sqlite3
import types
from dataclasses import dataclass
from typing import Any

import torch.utils.data._utils.worker

from loaderdoctor.plain.frames import StackFrame
from loaderdoctor.plain.usercode import is_user_frame
from loaderdoctor.workers.filelocks import FILE_LOCK_FUNCTIONS

try:
    from multiprocessing.synchronize import SemLock
except ImportError:  # a platform without working sem_open
    SemLock = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class Site:
    """A line of code, and the lock call in progress there ("fcntl.flock", "threading.Lock.acquire") or None."""

    file: str
    line: int
    function: str
    lock: str | None = None


# The worker loop of torch's DataLoader, and the call in which it waits for its next indices.
_WORKER_LOOP = torch.utils.data._utils.worker._worker_loop.__code__
_NEXT_INDICES = multiprocessing.queues.Queue.get.__code__
_MAX_DEPTH = 256
_MAX_CACHED = 20_000

# Libraries whose frames are a lock being taken: the user's call into them is the call site.
_LOCK_PACKAGES = ("filelock", "portalocker", "fasteners")
_THREADING_WAITS = frozenset({"acquire", "wait", "wait_for", "__enter__"})

# Methods that wait for a lock, by the kind of object they are called on.
_LOCK_METHODS = frozenset({"acquire", "__enter__"})
_SQLITE_METHODS = frozenset({"execute", "executemany", "executescript", "commit"})  # sqlite's busy wait

# Roles of a frame besides a lock library's lock name: the user's code, loaderdoctor's file-lock wrappers (see
# filelocks.py: seen through, as if the user called the function they wrap), anything else.
_USER, _TRANSPARENT, _OTHER = "user", "transparent", "other"
_WRAPPERS_MODULE = "loaderdoctor.workers.filelocks"
_CALLS = frozenset({"CALL", "CALL_FUNCTION_EX", "CALL_KW"})
_BEFORE_WITH = dis.opmap.get("BEFORE_WITH")
_CACHE = dis.opmap.get("CACHE")
_MISSING = object()


def site_of(frame: types.FrameType) -> Site | None:
    """Where the thread whose innermost frame is `frame` is: the innermost frame of the user's code, with the
    lock it waits in if any; without one, the innermost frame. In a DataLoader worker only the frames its loop
    called count, and None means that the worker waits in the loop for its next indices: it has no work."""
    inner: list[types.FrameType] = []
    current: types.FrameType | None = frame
    while current is not None and current.f_code is not _WORKER_LOOP and len(inner) < _MAX_DEPTH:
        inner.append(current)
        current = current.f_back
    if current is not None and inner and inner[-1].f_code is _NEXT_INDICES:
        return None
    called = _OTHER  # the role of the frame that the frame at hand called (loaderdoctor's wrappers skipped)
    for each in inner:
        role = _role(each)
        if role == _USER:
            library = None if called in (_USER, _OTHER) else called
            return Site(each.f_code.co_filename, each.f_lineno, each.f_code.co_name, _lock_called(each) or library)
        if role != _TRANSPARENT:
            called = role
    innermost = inner[0] if inner else frame
    return Site(innermost.f_code.co_filename, innermost.f_lineno, innermost.f_code.co_name)


_roles: dict[types.CodeType, str] = {}


def _role(frame: types.FrameType) -> str:
    """_USER for the user's code, the lock's name for a lock library's frame, _TRANSPARENT for loaderdoctor's
    file-lock wrappers, else _OTHER; cached per code object."""
    code = frame.f_code
    role = _roles.get(code)
    if role is None:
        if len(_roles) > _MAX_CACHED:
            _roles.clear()
        module = frame.f_globals.get("__name__")
        module = module if isinstance(module, str) else ""
        if module == _WRAPPERS_MODULE:
            role = _TRANSPARENT
        else:
            role = _library_lock(module, code) or (
                _USER if is_user_frame(StackFrame(code.co_filename, 0, code.co_name)) else _OTHER
            )
        _roles[code] = role
    return role


def _library_lock(module: str, code: types.CodeType) -> str | None:
    """The lock a lock library's frame takes ("filelock.BaseFileLock.acquire"); None for other code."""
    top = module.partition(".")[0]
    if top in _LOCK_PACKAGES:
        return f"{top}.{code.co_qualname}"
    if module == "multiprocessing.synchronize":
        return f"multiprocessing.{code.co_qualname}"
    if module == "threading" and code.co_name in _THREADING_WAITS:
        return f"threading.{code.co_qualname}"
    return None


@dataclass(frozen=True)
class _Callee:
    """The expression called (or entered by `with`) at an instruction: a name and its attributes."""

    path: tuple[str, ...]  # ("fcntl", "flock"), ("self", "lock")
    entered: bool  # `with path:` (its __enter__ runs), else `path(...)`
    local: bool  # whether the name is a local of the function (else a global or builtin)


_callees: dict[tuple[types.CodeType, int], _Callee | None] = {}


def _lock_called(frame: types.FrameType) -> str | None:
    """The lock the frame's call in progress takes, or None when it is no lock (or cannot be told)."""
    callee = _callee_at(frame.f_code, frame.f_lasti)
    resolved = None if callee is None else _resolve(frame, callee)
    if callee is None or resolved is None:
        return None
    owner, target = resolved
    if callee.entered:
        kind = _lock_kind(target)
        return f"{kind[0]}.__enter__" if kind is not None and "__enter__" in kind[1] else None
    name = _file_lock_name(target)
    if name is not None:
        return name
    kind = _lock_kind(owner) if owner is not _MISSING else None
    method = callee.path[-1]
    return f"{kind[0]}.{method}" if kind is not None and method in kind[1] else None


def _callee_at(code: types.CodeType, lasti: int) -> _Callee | None:
    """_callee, cached per code object and instruction; None where the source cannot be read or parsed."""
    key = (code, lasti)
    if key in _callees:
        return _callees[key]
    if len(_callees) > _MAX_CACHED:
        _callees.clear()
    try:
        callee = _callee(code, lasti)
    except (SyntaxError, ValueError, IndexError, UnicodeError, OSError, MemoryError, RecursionError):
        callee = None
    _callees[key] = callee
    return callee


def _callee(code: types.CodeType, lasti: int) -> _Callee | None:
    """What the instruction at byte offset `lasti` calls or enters, from its source span; None when it is
    neither, or the callee is not a plain name with attributes (`f()(x)` would need evaluating)."""
    if lasti < 0:
        return None
    instructions = code.co_code
    while lasti >= 2 and instructions[lasti] == _CACHE:
        lasti -= 2  # a frame that called Python code points past its call's inline cache entries
    opcode = instructions[lasti]
    entered = opcode == _BEFORE_WITH
    if not entered and dis.opname[opcode] not in _CALLS:
        return None
    positions = list(code.co_positions())
    span = positions[lasti // 2]
    source = _source_span(code.co_filename, span)
    if source is None:
        return None
    if entered:
        # The span is the whole `with` statement: the k-th BEFORE_WITH of that span enters its k-th item.
        earlier = sum(1 for i in range(0, lasti, 2) if instructions[i] == _BEFORE_WITH and positions[i // 2] == span)
        statement = ast.parse(source).body[0]
        if not isinstance(statement, ast.With) or earlier >= len(statement.items):
            return None
        expression = statement.items[earlier].context_expr
    else:
        call = ast.parse(f"({source})", mode="eval").body  # parenthesised: a span may cross lines
        if not isinstance(call, ast.Call):
            return None
        expression = call.func
    path = _dotted(expression)
    if path is None:
        return None
    local = path[0] in code.co_varnames or path[0] in code.co_cellvars or path[0] in code.co_freevars
    return _Callee(path, entered, local)


def _source_span(filename: str, span: tuple[int | None, ...]) -> str | None:
    """The source text of a span (lines and UTF-8 byte columns, as co_positions gives them)."""
    line, end_line, column, end_column = span
    if line is None or end_line is None or column is None or end_column is None:
        return None
    lines = linecache.getlines(filename)
    if end_line > len(lines):
        return None
    chunk = [text.encode() for text in lines[line - 1 : end_line]]
    chunk[-1] = chunk[-1][:end_column]
    chunk[0] = chunk[0][column:]
    return b"".join(chunk).decode(errors="replace")


def _dotted(expression: ast.expr) -> tuple[str, ...] | None:
    """("a", "b", "c") for the expression a.b.c; None for anything else."""
    if isinstance(expression, ast.Name):
        return (expression.id,)
    if isinstance(expression, ast.Attribute):
        owner = _dotted(expression.value)
        return None if owner is None else (*owner, expression.attr)
    return None


def _resolve(frame: types.FrameType, callee: _Callee) -> tuple[Any, Any] | None:
    """(the object whose attribute is called, or _MISSING for a plain name; the object called), looked up in
    the frame without running any of the user's code; None when a name is not bound."""
    root, *attributes = callee.path
    global_scope = frame.f_globals if root in frame.f_globals else frame.f_builtins
    namespace = frame.f_locals if callee.local else global_scope
    if root not in namespace:
        return None
    owner, target = _MISSING, namespace[root]
    for attribute in attributes:
        owner, target = target, inspect.getattr_static(target, attribute, _MISSING)
        if target is _MISSING:
            return None
    return owner, target


def _file_lock_name(target: Any) -> str | None:
    """The name of a file-lock function ("fcntl.flock", "fcntl.lockf", "os.lockf") when `target` is that
    function or a wrapper of it whose __wrapped__ leads to it (as loaderdoctor's own in a worker: see
    filelocks.py); else None."""
    for _ in range(8):
        for name, function in FILE_LOCK_FUNCTIONS:
            if target is function:
                return name
        if type(target) is not types.FunctionType:
            return None
        target = target.__dict__.get("__wrapped__")
    return None


def _lock_kind(target: Any) -> tuple[str, frozenset[str]] | None:
    """The kind of lock an object is ("threading.Lock", "multiprocessing.Lock", "sqlite3.Connection") and its
    methods that wait; None for other objects. Read from its type alone."""
    kind = type(target)
    if kind is _thread.LockType:
        return "threading.Lock", _LOCK_METHODS
    if kind is _thread.RLock:
        return "threading.RLock", _LOCK_METHODS
    ancestors = kind.__mro__
    if SemLock is not None and SemLock in ancestors:
        return f"multiprocessing.{kind.__name__}", _LOCK_METHODS
    if sqlite3.Connection in ancestors:
        return "sqlite3.Connection", _SQLITE_METHODS
    if sqlite3.Cursor in ancestors:
        return "sqlite3.Cursor", _SQLITE_METHODS
    return None
