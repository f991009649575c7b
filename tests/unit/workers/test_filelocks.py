"""The file-lock watch: lock calls counted by the access mode of the file locked, those on read-only files made
no-ops in a lock-free run (and only those), and the originals put back everywhere they were replaced."""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from fcntl import flock as lock_file

import pytest

from loaderdoctor.workers.activity import LockCalls
from loaderdoctor.workers.filelocks import FileLockWatch, opened_read_only

# In a tuple: installing replaces the originals wherever a module's globals hold them, this module's too.
ORIGINALS = (fcntl.flock, fcntl.lockf, os.lockf)


@pytest.fixture
def data_file(tmp_path) -> str:
    path = tmp_path / "poses.bin"
    path.write_bytes(b"x" * 64)
    return str(path)


@pytest.fixture
def watch() -> Iterator[FileLockWatch]:
    watching = FileLockWatch()
    watching.install()
    try:
        yield watching
    finally:
        watching.uninstall()


@pytest.fixture
def lock_free() -> Iterator[FileLockWatch]:
    watching = FileLockWatch(lock_free=True)
    watching.install()
    try:
        yield watching
    finally:
        watching.uninstall()


def _locked_by_another(path: str) -> bool:
    """Whether another open file of `path` finds it locked (flock locks conflict between open files)."""
    with open(path, "rb") as other:
        try:
            ORIGINALS[0](other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        ORIGINALS[0](other, fcntl.LOCK_UN)
        return False


def test_installing_replaces_every_name_of_the_originals_and_uninstalling_puts_them_back():
    this_module = sys.modules[__name__]
    watching = FileLockWatch()
    watching.install()
    try:
        assert fcntl.flock is not ORIGINALS[0] and fcntl.flock.__wrapped__ is ORIGINALS[0]
        assert this_module.lock_file is fcntl.flock  # `from fcntl import flock as lock_file` seen too
        assert os.lockf.__wrapped__ is ORIGINALS[2]
    finally:
        watching.uninstall()
    assert (fcntl.flock, fcntl.lockf, os.lockf) == ORIGINALS
    assert this_module.lock_file is ORIGINALS[0]


def test_lock_calls_are_counted_by_the_files_access_mode(watch, data_file):
    with open(data_file, "rb") as reading, open(data_file, "r+b") as writing:
        lock_file(reading, fcntl.LOCK_EX)
        assert _locked_by_another(data_file)  # counted, and really taken
        lock_file(reading, fcntl.LOCK_UN)  # unlocks are not counted
        fcntl.flock(reading.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(reading.fileno(), fcntl.LOCK_UN)
        fcntl.lockf(writing, fcntl.LOCK_EX)
        fcntl.lockf(writing, fcntl.LOCK_UN)
        os.lockf(writing.fileno(), os.F_LOCK, 0)
        os.lockf(writing.fileno(), os.F_TEST, 0)  # tests, takes nothing: not counted
        os.lockf(writing.fileno(), os.F_ULOCK, 0)
    assert watch.counts() == LockCalls(read_only_exclusive=1, read_only_shared=1, writable=2, made_free=0)


def test_lock_free_makes_locks_on_read_only_files_no_ops(lock_free, data_file):
    with open(data_file, "rb") as reading:
        assert fcntl.flock(reading, fcntl.LOCK_EX) is None
        assert not _locked_by_another(data_file)
        fcntl.flock(reading, fcntl.LOCK_UN)
    assert lock_free.counts() == LockCalls(read_only_exclusive=1, made_free=1)


def test_lock_free_keeps_locks_on_writable_files(lock_free, data_file):
    with open(data_file, "r+b") as writing:
        fcntl.flock(writing, fcntl.LOCK_EX)
        assert _locked_by_another(data_file)
        fcntl.flock(writing, fcntl.LOCK_UN)
        assert not _locked_by_another(data_file)
    assert lock_free.counts() == LockCalls(writable=1)


def test_a_call_on_what_is_not_an_open_file_fails_as_it_would(watch, data_file):
    with open(data_file, "rb") as reading:
        number = os.dup(reading.fileno())
    os.close(number)
    with pytest.raises(OSError):
        fcntl.flock(number, fcntl.LOCK_EX)
    assert opened_read_only(number) is None
    assert watch.counts() == LockCalls()
