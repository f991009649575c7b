"""Shared test fixtures: every test keeps its run history in a folder of its own, and must leave no child process
and no non-daemon thread behind."""

from __future__ import annotations

import contextlib
import threading
import time

import psutil
import pytest

# multiprocessing keeps these helpers alive for the whole interpreter by design (one each, at most):
# they are not leaks of the code under test, and they end with the test session.
_INTERPRETER_SINGLETONS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
_GRACE_S = 5.0


def _live_children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(name in " ".join(child.cmdline()) for name in _INTERPRETER_SINGLETONS):
                continue
            alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.fixture(autouse=True)
def private_history_home(tmp_path_factory, monkeypatch):
    """LOADERDOCTOR_HOME in a fresh folder, so that no test (nor a process it starts) writes into the user's own
    history."""
    home = tmp_path_factory.mktemp("loaderdoctor-home")
    monkeypatch.setenv("LOADERDOCTOR_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def no_leftover_processes_or_threads():
    children_before = {p.pid for p in _live_children()}
    threads_before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + _GRACE_S
    while True:
        children = [p for p in _live_children() if p.pid not in children_before]
        threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive() and not t.daemon]
        if not children and not threads:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    described = []
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            described.append(f"pid {child.pid}: {' '.join(child.cmdline())[:120]}")
            child.kill()
    pytest.fail(
        "the test left behind " + "; ".join(filter(None, [", ".join(described), ", ".join(t.name for t in threads)]))
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every integration and browser test starts real processes: marked `workers` (`make test-fast` leaves them
    out)."""
    for item in items:
        if "integration" in item.path.parts or "browser" in item.path.parts:
            item.add_marker(pytest.mark.workers)


@pytest.fixture(autouse=True)
def processes_only_where_marked(request, monkeypatch):
    """A test that starts a process (a DataLoader worker, a subprocess) must be marked `workers`, so that
    `make test-fast` (-m "not workers") runs only tests that start none."""
    import multiprocessing.process
    import subprocess

    started: list[str] = []
    start, popen_init = multiprocessing.process.BaseProcess.start, subprocess.Popen.__init__

    def noting_start(self, *args, **kwargs):
        started.append(f"a {type(self).__name__}")
        return start(self, *args, **kwargs)

    def noting_popen(self, *args, **kwargs):
        started.append("a subprocess")
        return popen_init(self, *args, **kwargs)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", noting_start)
    monkeypatch.setattr(subprocess.Popen, "__init__", noting_popen)
    yield
    if started and request.node.get_closest_marker("workers") is None:
        pytest.fail(f"the test started {started[0]} but is not marked workers: add @pytest.mark.workers")
