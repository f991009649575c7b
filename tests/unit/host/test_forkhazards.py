"""Library threads known to hold no lock a forked worker needs (IPython's history thread, Lightning's DDP
child-process observer) raise no fork-unsafe finding alone, known by the code they run, never by their name."""

from __future__ import annotations

import functools
import os
import threading

import pytest
from recordings import make_iterators, make_recording

from loaderdoctor.host import forkhazards
from loaderdoctor.host.forkhazards import ForkHazards, is_benign, other_threads
from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import AliveThread, IteratorFacts
from loaderdoctor.rules.safety import fork_unsafe

FORKED = Settings(num_workers=2, persistent_workers=True, start_method="fork")

IPYTHON_HISTORY = AliveThread(
    "IPythonHistorySavingThread", "IPython/core/history.py:1031 in HistorySavingThread.run", "IPython"
)
LIGHTNING_OBSERVER = AliveThread(
    "child-process-observer",
    "lightning/fabric/strategies/launchers/subprocess_script.py:198 in _ChildProcessObserver.run",
    "lightning",
)
# As a recording saved before entry points were named with their class wrote it.
OLD_OBSERVER = AliveThread(
    "child-process-observer",
    "lightning_fabric/strategies/launchers/subprocess_script.py:198 in run",
    "lightning_fabric",
)


def _forked(*threads: AliveThread, cuda_initialized: bool = False):
    facts = [
        IteratorFacts(epoch=e, start_method="fork", threads=list(threads), cuda_initialized=cuda_initialized)
        for e in range(2)
    ]
    return make_recording(settings=FORKED, iterators=facts)


@pytest.mark.parametrize("thread", [IPYTHON_HISTORY, LIGHTNING_OBSERVER, OLD_OBSERVER])
def test_a_known_benign_library_thread_alone_raises_no_fork_warning(thread):
    assert fork_unsafe(_forked(thread)) is None
    assert not ForkHazards.of(_forked(thread).iterators)
    assert is_benign(thread)


def test_the_finding_stays_for_another_hazard_without_naming_the_benign_threads():
    finding = fork_unsafe(_forked(IPYTHON_HISTORY, LIGHTNING_OBSERVER, cuda_initialized=True))
    assert finding is not None
    assert finding.evidence["threads"] == []
    assert finding.evidence["cuda_initialized"] is True
    assert "IPython" not in finding.title and "thread" not in finding.title
    assert "before those threads" not in finding.fix  # no remedy for threads that are no hazard
    user = AliveThread("metrics-uploader", "train.py:12 in upload", None)
    finding = fork_unsafe(_forked(IPYTHON_HISTORY, user))
    assert finding is not None
    assert finding.evidence["threads"] == ["metrics-uploader running train.py:12 in upload"]


@pytest.mark.parametrize(
    "thread",
    [
        # A user's thread that took the name of IPython's: its own code runs.
        AliveThread("IPythonHistorySavingThread", "notebook_helpers.py:3 in HistorySavingThread.run", None),
        AliveThread("child-process-observer", "train.py:40 in watch", None),
        # Other code of the same packages is not vouched for.
        AliveThread("IPythonHistorySavingThread", "IPython/core/interactiveshell.py:80 in Poller.run", "IPython"),
        AliveThread("x", "lightning/pytorch/callbacks/progress/rich_progress.py:72 in _RefreshThread.run", "lightning"),
    ],
)
def test_a_thread_is_benign_by_what_it_runs_not_by_its_name(thread):
    assert not is_benign(thread)
    assert fork_unsafe(_forked(thread)) is not None
    # Named like a benign one and seen at another iterator, it is still the hazard.
    assert ForkHazards.of(_forked(IPYTHON_HISTORY, LIGHTNING_OBSERVER, thread).iterators).threads == (thread,)


def test_lightnings_installed_observer_is_recognised_from_its_class():
    """The entry point read from the installed Lightning's _ChildProcessObserver matches (not started: it would
    poll every 5 s)."""
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    observer = _ChildProcessObserver(main_pid=os.getpid(), child_processes=[])
    runs, package = forkhazards._entry_point(observer, {})
    assert package == "lightning"
    assert runs.startswith("lightning/fabric/strategies/launchers/subprocess_script.py:")
    assert runs.endswith(" in _ChildProcessObserver.run")
    assert is_benign(AliveThread(observer.name, runs, package))


def _logged(run):
    @functools.wraps(run)
    def wrapper(self):
        return run(self)

    return wrapper


class _DecoratedThread(threading.Thread):
    """Like IPython's history thread, whose run() a decorator wraps."""

    def __init__(self) -> None:
        super().__init__(name="decorated", daemon=True)
        self.release = threading.Event()

    @_logged
    def run(self) -> None:
        self.release.wait(5.0)


def test_a_threads_entry_point_is_its_classs_run_under_its_decorators():
    thread = _DecoratedThread()
    thread.start()
    try:
        (alive,) = [t for t in other_threads() if t.name == "decorated"]
    finally:
        thread.release.set()
        thread.join()
    assert alive.runs.endswith(" in _DecoratedThread.run")  # not the decorator's wrapper
    assert os.path.relpath(__file__) in alive.runs


def test_make_iterators_threads_by_name_stay_hazards():
    """Threads known by name only (no entry point) are hazards as before."""
    rec = make_recording(settings=FORKED, iterators=make_iterators(2, threads=["IPythonHistorySavingThread"]))
    assert fork_unsafe(rec) is not None
