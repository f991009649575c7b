"""Sites of real threads blocked in real locks: the line in the user's code and the lock, found from what is
really called (an alias, an attribute, a `with`, a lock library), and a line that only waits named no lock."""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import multiprocessing
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from fcntl import flock as lock_file

import pytest

from loaderdoctor.host.facts import thread_frames
from loaderdoctor.workers.callsites import Site, site_of

WAIT_S = 10.0
THIS_FILE = __file__


def _line_of(function: Callable[..., object], text: str) -> int:
    """The line number of the first line of `function` containing `text`."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


@contextlib.contextmanager
def blocked(target: Callable[[], object], release: Callable[[], object]) -> Iterator[Site]:
    """Run `target` in a thread until its site shows it blocked in a lock (or WAIT_S passed: then the site
    where it is), yield that site, and then release it and end the thread."""
    started = threading.Event()

    def run() -> None:
        started.set()
        target()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        started.wait(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        site = None
        while time.monotonic() < deadline:
            frame = thread_frames().get(thread.ident or -1)
            site = site_of(frame) if frame is not None else None
            if site is not None and site.function == target.__name__ and site.lock is not None:
                break
            time.sleep(0.01)
        yield site
    finally:
        release()
        thread.join(WAIT_S)
    assert not thread.is_alive()


def test_a_thread_blocked_in_fcntl_flock_through_an_alias(tmp_path):
    path = tmp_path / "poses.bin"
    path.write_bytes(b"x" * 64)
    holder = open(path, "rb")  # noqa: SIM115 (closed to release the waiting thread)
    fcntl.flock(holder, fcntl.LOCK_EX)

    def read_pose() -> None:
        with open(path, "rb") as f:
            lock_file(f, fcntl.LOCK_EX)  # `from fcntl import flock as lock_file`

    with blocked(read_pose, holder.close) as site:
        assert site == Site(THIS_FILE, _line_of(read_pose, "lock_file(f"), "read_pose", "fcntl.flock")


def test_a_call_spanning_lines_through_the_module(tmp_path):
    path = tmp_path / "poses.bin"
    path.write_bytes(b"x" * 64)
    holder = open(path, "rb")  # noqa: SIM115
    fcntl.flock(holder, fcntl.LOCK_EX)

    def read_pose() -> None:
        with open(path, "rb") as f:
            fcntl.flock(
                f,
                fcntl.LOCK_EX,
            )

    with blocked(read_pose, holder.close) as site:
        assert site == Site(THIS_FILE, _line_of(read_pose, "fcntl.flock("), "read_pose", "fcntl.flock")


def test_threading_lock_acquire_and_with():
    lock = threading.Lock()
    lock.acquire()

    def acquire() -> None:
        lock.acquire()
        lock.release()

    with blocked(acquire, lock.release) as site:
        assert site == Site(THIS_FILE, _line_of(acquire, "lock.acquire()"), "acquire", "threading.Lock.acquire")

    lock.acquire()

    def enter() -> None:
        with lock:
            pass

    with blocked(enter, lock.release) as site:
        assert site == Site(THIS_FILE, _line_of(enter, "with lock:"), "enter", "threading.Lock.__enter__")


class Holder:
    def __init__(self) -> None:
        self.lock = threading.RLock()


def test_the_item_of_a_with_that_blocks_is_the_one_named():
    holder = Holder()
    taken = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with holder.lock:
            taken.set()
            done.wait(WAIT_S)

    owner = threading.Thread(target=hold, daemon=True)
    owner.start()
    taken.wait(WAIT_S)

    def enter_both() -> None:
        with open(os.devnull) as _, holder.lock:
            pass

    try:
        with blocked(enter_both, done.set) as site:
            line = _line_of(enter_both, "with open(")
            assert site == Site(THIS_FILE, line, "enter_both", "threading.RLock.__enter__")
    finally:
        owner.join(WAIT_S)


def test_a_multiprocessing_lock():
    lock = multiprocessing.Lock()
    lock.acquire()

    def acquire() -> None:
        with lock:
            pass

    with blocked(acquire, lock.release) as site:
        assert site == Site(THIS_FILE, _line_of(acquire, "with lock:"), "acquire", "multiprocessing.Lock.__enter__")


def test_a_lock_library_is_named_at_the_users_call(tmp_path):
    filelock = pytest.importorskip("filelock")
    path = str(tmp_path / "cache.lock")
    held = filelock.FileLock(path)
    held.acquire()

    def fill_cache() -> None:
        with filelock.FileLock(path):
            pass

    with blocked(fill_cache, held.release) as site:
        line = _line_of(fill_cache, "with filelock.FileLock")
        assert site == Site(THIS_FILE, line, "fill_cache", "filelock.BaseFileLock.__enter__")


def test_sqlites_busy_wait(tmp_path):
    path = str(tmp_path / "index.sqlite3")
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE poses (id INTEGER)")
    writer.execute("BEGIN EXCLUSIVE")

    def look_up() -> None:
        reader = sqlite3.connect(path, timeout=WAIT_S)
        try:
            reader.execute("SELECT count(*) FROM poses").fetchone()
        finally:
            reader.close()

    try:
        with blocked(look_up, lambda: writer.execute("COMMIT")) as site:
            line = _line_of(look_up, "reader.execute")
            assert site == Site(THIS_FILE, line, "look_up", "sqlite3.Connection.execute")
    finally:
        writer.close()


def test_a_line_that_waits_without_a_lock_is_no_lock():
    flock = time.sleep  # a lock's name, not a lock: what is called decides
    woken = threading.Event()

    def load_slowly() -> None:
        flock(0.3)
        woken.set()

    thread = threading.Thread(target=load_slowly, daemon=True)
    thread.start()
    site = None
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not woken.is_set():
        frame = thread_frames().get(thread.ident or -1)
        if frame is not None and (site := site_of(frame)) is not None and site.function == "load_slowly":
            break
        time.sleep(0.005)
    thread.join(WAIT_S)
    assert site == Site(THIS_FILE, _line_of(load_slowly, "flock(0.3)"), "load_slowly", None)
