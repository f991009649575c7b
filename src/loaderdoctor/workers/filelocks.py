"""fcntl.flock, fcntl.lockf and os.lockf watched in a worker process: every lock call counted by the access mode
of the file it locks, and in a lock-free run the calls on files opened read-only made no-ops.

Installed by the probe's worker hook in worker processes only: the user's code on disk, and the training
process, are never changed. The functions are replaced in the fcntl and os modules and wherever a loaded
module holds them (`from fcntl import flock`), so that calls made through any of these names are seen.
"""

from __future__ import annotations

import fcntl
import functools
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from loaderdoctor.workers.activity import LockCalls

_UNLOCK, _SHARED, _EXCLUSIVE = "unlock", "shared", "exclusive"
_get_flags = fcntl.fcntl  # the original, whatever is replaced later


_FLOCK_MODES = {fcntl.LOCK_UN: _UNLOCK, fcntl.LOCK_SH: _SHARED, fcntl.LOCK_EX: _EXCLUSIVE}
# POSIX record locks taken through os.lockf are exclusive; F_TEST takes none.
_LOCKF_MODES = {os.F_LOCK: _EXCLUSIVE, os.F_TLOCK: _EXCLUSIVE, os.F_ULOCK: _UNLOCK}


def _flock_mode(operation: Any) -> str | None:
    """What a flock or fcntl.lockf operation does: unlock, shared or exclusive; None when it is not one."""
    return _FLOCK_MODES.get(operation & ~fcntl.LOCK_NB) if isinstance(operation, int) else None


def _lockf_mode(command: Any) -> str | None:
    """What an os.lockf command does: unlock or exclusive; None when it is not one (F_TEST)."""
    return _LOCKF_MODES.get(command) if isinstance(command, int) else None


# (module, name, the original function, how to read its command)
_WATCHED: tuple[tuple[types.ModuleType, str, Callable[..., Any], Callable[[Any], str | None]], ...] = (
    (fcntl, "flock", fcntl.flock, _flock_mode),
    (fcntl, "lockf", fcntl.lockf, _flock_mode),
    (os, "lockf", os.lockf, _lockf_mode),
)

# The file-lock functions by what they are called, for telling a call to one apart (see callsites.py).
FILE_LOCK_FUNCTIONS: tuple[tuple[str, Callable[..., Any]], ...] = tuple(
    (f"{module.__name__}.{name}", original) for module, name, original, _ in _WATCHED
)


def opened_read_only(fd: Any) -> bool | None:
    """Whether a file descriptor (or an object with fileno()) is open for reading only; None when that cannot
    be told (not an open file)."""
    try:
        number = fd if isinstance(fd, int) else fd.fileno()
        return _get_flags(number, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    except (OSError, ValueError, TypeError, AttributeError):
        return None


class FileLockWatch:
    """While installed, counts this process's file-lock calls by the access mode of the file locked, and with
    `lock_free` makes those on read-only files (their unlocks too) return at once without locking."""

    def __init__(self, *, lock_free: bool = False) -> None:
        self.lock_free = lock_free
        self._lock = threading.Lock()
        self._calls = LockCalls()
        self._wrappers = {id(original): (original, self._wrap(original, mode)) for _, _, original, mode in _WATCHED}
        self._replaced: list[tuple[dict[str, Any], str, Callable[..., Any]]] = []

    def counts(self) -> LockCalls:
        """The calls counted so far (a copy)."""
        with self._lock:
            return LockCalls(**vars(self._calls))

    def install(self) -> None:
        """Put the watching functions in place of the originals, in every module loaded that holds one."""
        if self._replaced:
            return
        for module in list(sys.modules.values()):
            if not isinstance(module, types.ModuleType):
                continue  # sys.modules may hold other objects; only modules' globals are changed
            namespace = module.__dict__
            for name, value in list(namespace.items()):
                found = self._wrappers.get(id(value))
                if found is not None and found[0] is value:
                    namespace[name] = found[1]
                    self._replaced.append((namespace, name, value))

    def uninstall(self) -> None:
        """Put the originals back where they were replaced (where nothing else replaced them since)."""
        for namespace, name, original in self._replaced:
            if namespace.get(name) is self._wrappers[id(original)][1]:
                namespace[name] = original
        self._replaced.clear()

    def _wrap(self, original: Callable[..., Any], mode_of: Callable[[Any], str | None]) -> Callable[..., Any]:
        @functools.wraps(original)  # __wrapped__ names the original: callsites.py resolves a call to it
        def watched(fd: Any, command: Any, /, *args: Any, **kwargs: Any) -> Any:
            if self._skips(fd, mode_of(command)):
                return None
            return original(fd, command, *args, **kwargs)

        return watched

    def _skips(self, fd: Any, mode: str | None) -> bool:
        """Count one call; whether to make it a no-op (a lock-free run, on a file opened read-only)."""
        if mode is None:
            return False  # not a lock call (F_TEST): the original decides
        read_only = opened_read_only(fd)
        if read_only is None:
            return False  # not an open file: the original raises as it would
        free = self.lock_free and read_only
        if mode == _UNLOCK:
            return free
        with self._lock:
            if not read_only:
                self._calls.writable += 1
            elif mode == _EXCLUSIVE:
                self._calls.read_only_exclusive += 1
            else:
                self._calls.read_only_shared += 1
            if free:
                self._calls.made_free += 1
        return free
