"""Fork hazards: what runs in the main process when workers would fork (threads, CUDA, compiling), taken as plain
IteratorFacts when an iterator starts workers and computed once, as ForkHazards, for the rules, the tuner and the
guard. Not what is imported: importing a module runs nothing a forked child inherits."""

from __future__ import annotations

import inspect
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from loaderdoctor.host.facts import OWN_THREAD_PREFIX, thread_frames


@dataclass(frozen=True)
class AliveThread:
    """A thread of the main process other than the main one and loaderdoctor's own."""

    name: str
    runs: str  # where it runs: its entry point, "tqdm/_monitor.py:60 in TMonitor.run"; "" when unknown
    package: str | None = None  # the installed package of that code ("tqdm"); None for the user's own code

    def describe(self) -> str:
        """'tqdm_monitor, a thread of tqdm running tqdm/_monitor.py:60 in run'."""
        owner = f", a thread of {self.package}" if self.package else ""
        where = f" running {self.runs}" if self.runs else ""
        return f"{self.name}{owner}{where}"


@dataclass
class IteratorFacts:
    """What held in the main process when an iterator (and so its workers) was created: what runs there,
    not what is imported."""

    epoch: int
    start_method: str | None
    threads: list[AliveThread]  # the other threads alive in the main process, loaderdoctor's own excluded
    cuda_initialized: bool
    compiled_frames: int = 0  # frames torch.compile had compiled in this process
    compile_workers: int = 0  # processes of inductor's compile pool alive
    # OS threads Python did not start (OpenMP, BLAS, CUDA pools...): usually harmless to fork, since torch gives
    # each worker one thread, but a worker that enlarges its pool again can hang on the copied pool's state.
    native_threads: int = 0


# multiprocessing's queue feeders serve earlier iterators' queues; workers never touch their locks.
_HARMLESS_THREADS = ("QueueFeederThread",)
_THREADING_FILE = os.path.realpath(threading.__file__)
_COMPILE_WORKER_MARK = "compile_worker"  # torch/_inductor/compile_worker/__main__.py: inductor's compile pool

# Library threads that hold no lock a forked worker takes while it loads samples, known by the code they run
# (their package, and the file and function of their entry point), never by a thread's name, which anyone can give:
# - IPython's HistorySavingThread, alive in every IPython or Jupyter session, waits on an Event, then writes the
#   inputs of a cell through a sqlite3 connection it opened itself, under the HistoryManager's cache locks: only
#   the shell's history code takes those (a worker never runs it), and no worker uses that connection. Forked in
#   the midst of a write, a worker could only find sqlite's own process-wide mutexes held, which matter to a worker
#   that opens sqlite3 itself; IPython releases since ipython/ipython#15115 (2026) stop the thread before every
#   fork anyway. (ipykernel's own threads, ZMQ's I/O ones, are not vouched for here.)
# - Lightning's _ChildProcessObserver ("child-process-observer", started by the DDP subprocess launcher in rank 0)
#   sleeps 5 s and polls the ranks' Popen objects, which a worker never touches; only once a rank died does it
#   log (logging resets its locks in a forked child) and kill the job.
# - tqdm's monitor (TMonitor, "tqdm_monitor", started with the first progress bar: `datasets` draws one as it maps)
#   sleeps 10 s on an Event, then takes tqdm's own lock to slow down bars that print too often. A forked worker
#   needs that lock only to draw a tqdm bar itself, which loading a sample does not; it holds no other.
_BENIGN_THREADS = {
    ("tqdm", "tqdm/_monitor.py", "TMonitor.run"),
    ("IPython", "IPython/core/history.py", "HistorySavingThread.run"),
    ("lightning", "lightning/fabric/strategies/launchers/subprocess_script.py", "_ChildProcessObserver.run"),
    ("lightning_fabric", "lightning_fabric/strategies/launchers/subprocess_script.py", "_ChildProcessObserver.run"),
}


def is_benign(thread: AliveThread) -> bool:
    """Whether a thread runs library code known to hold no lock a forked worker needs (see _BENIGN_THREADS): by
    its package and entry point, so a user's thread of the same name is still a hazard. An entry point recorded
    before functions were named with their class ('run') matches too."""
    where, _, function = thread.runs.rpartition(" in ")
    path = where.rpartition(":")[0]
    return any(
        thread.package == package and path == file and function in (qualname, qualname.rpartition(".")[2])
        for package, file, qualname in _BENIGN_THREADS
    )


def _package_of(path: str) -> str | None:
    """The installed package a source file belongs to ("tqdm" for .../site-packages/tqdm/_monitor.py)."""
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            rest = parts[parts.index(marker) + 1 :]
            if rest:
                return rest[0].removesuffix(".py")
    return None


def _entry_code(thread: threading.Thread, frames: dict[int, Any]) -> Any:
    """The code a thread runs: its class's own run() where it overrides threading's (unwrapped from decorators,
    as IPython's history thread's is), else its outermost frame outside threading.py (its target); None when
    unknown."""
    code = getattr(inspect.unwrap(type(thread).run), "__code__", None)
    if code is not None and os.path.realpath(code.co_filename) != _THREADING_FILE:
        return code
    frame = frames.get(thread.ident or -1)
    entry = None
    while frame is not None:
        if os.path.realpath(frame.f_code.co_filename) != _THREADING_FILE:
            entry = frame.f_code
        frame = frame.f_back
    return entry


def _entry_point(thread: threading.Thread, frames: dict[int, Any]) -> tuple[str, str | None]:
    """Where a thread runs: its entry point ("tqdm/_monitor.py:60 in TMonitor.run"), and the package of that
    code; ("", None) when it cannot be read."""
    entry = _entry_code(thread, frames)
    if entry is None:
        return "", None
    path = entry.co_filename
    package = _package_of(path)
    shown = path
    if package is not None:
        shown = path[path.rfind(os.sep + package + os.sep) + 1 :]
    elif path.startswith(os.getcwd() + os.sep):
        shown = os.path.relpath(path)
    # A class's method by its class ("TMonitor.run"); a function defined inside another by its own name ("hold").
    name = entry.co_qualname.rpartition("<locals>.")[2]
    return f"{shown}:{entry.co_firstlineno} in {name}", package


def other_threads() -> list[AliveThread]:
    """The threads alive in this process besides the main one and loaderdoctor's own, with where they run."""
    frames = thread_frames()
    alive = []
    for thread in threading.enumerate():
        if (
            thread is threading.main_thread()
            or thread.name.startswith(OWN_THREAD_PREFIX)
            or thread.name in _HARMLESS_THREADS
        ):
            continue
        runs, package = _entry_point(thread, frames)
        alive.append(AliveThread(thread.name, runs, package))
    return alive


def native_threads() -> int:
    """OS threads of this process that Python's threading module did not start."""
    try:
        return max(0, psutil.Process().num_threads() - threading.active_count())
    except psutil.Error:
        return 0


def compiled_frames() -> int:
    """Frames torch.compile has compiled in this process (0 when it never ran: importing it is not running it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    try:
        return int(counters.get("frames", {}).get("ok", 0))
    except (AttributeError, TypeError, ValueError):
        return 0


def compile_workers() -> int:
    """Child processes of inductor's compile-worker pool, which torch.compile starts in this process."""
    count = 0
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return 0
    for child in children:
        try:
            if any(_COMPILE_WORKER_MARK in part for part in child.cmdline()):
                count += 1
        except psutil.Error:
            continue
    return count


def iterator_facts(epoch: int, start_method: str | None) -> IteratorFacts:
    """What holds in the main process now, just before an iterator forks or spawns its workers."""
    return IteratorFacts(
        epoch=epoch,
        start_method=start_method,
        threads=other_threads(),
        cuda_initialized=bool(torch.cuda.is_initialized()),
        compiled_frames=compiled_frames(),
        compile_workers=compile_workers(),
        native_threads=native_threads(),
    )


@dataclass(frozen=True)
class ForkHazards:
    """What was alive in the main process when workers were created that a forked child cannot inherit safely.
    A module being imported is none of these: `import torchvision` loads inductor's config and runs nothing."""

    threads: tuple[AliveThread, ...] = ()
    cuda_initialized: bool = False
    compiled_frames: int = 0
    compile_workers: int = 0
    native_threads: int = 0

    @classmethod
    def of(cls, facts: list[IteratorFacts]) -> ForkHazards:
        """The hazards seen at any of these iterators' creation (a thread is listed once, by name; the known
        benign threads apart)."""
        threads: dict[str, AliveThread] = {}
        for it in facts:
            for thread in it.threads:
                if not is_benign(thread):
                    threads.setdefault(thread.name, thread)
        return cls(
            threads=tuple(threads[name] for name in sorted(threads)),
            cuda_initialized=any(it.cuda_initialized for it in facts),
            compiled_frames=max((it.compiled_frames for it in facts), default=0),
            compile_workers=max((it.compile_workers for it in facts), default=0),
            native_threads=max((it.native_threads for it in facts), default=0),
        )

    @classmethod
    def now(cls) -> ForkHazards:
        """The hazards of this process as it is now."""
        return cls.of([iterator_facts(0, None)])

    def __bool__(self) -> bool:
        """Whether there is a hazard worth a warning before anything failed (native thread pools are not:
        almost every torch process has them, and they hang a worker only in combination)."""
        return bool(self.threads) or self.cuda_initialized or self.compiled_frames > 0 or self.compile_workers > 0

    def explain(self, failed: bool, pools_in_workers: bool) -> bool:
        """Whether these hazards explain a failure. Native thread pools copied by fork do when the workers
        start thread pools again (the OpenMP/BLAS fork hang); on their own they are in every torch process."""
        return bool(self) or (failed and pools_in_workers and self.native_threads > 0)

    @property
    def thread_names(self) -> list[str]:
        return [t.name for t in self.threads]

    def describe(self) -> str:
        """The hazards in words, e.g. '1 other thread ran (tqdm_monitor, a thread of tqdm: ...) and CUDA was
        initialised'."""
        parts = []
        if self.threads:
            shown = "; ".join(t.describe() for t in self.threads[:3]) + ("; ..." if len(self.threads) > 3 else "")
            noun = "thread" if len(self.threads) == 1 else "threads"
            parts.append(f"{len(self.threads)} other {noun} ran ({shown})")
        if self.cuda_initialized:
            parts.append("CUDA was initialised")
        if self.compiled_frames:
            noun = "function" if self.compiled_frames == 1 else "functions"
            parts.append(f"torch.compile had compiled {self.compiled_frames} {noun}")
        if self.compile_workers:
            noun = "process" if self.compile_workers == 1 else "processes"
            parts.append(f"inductor's compile pool ran {self.compile_workers} {noun}")
        if self.native_threads:
            noun = "thread" if self.native_threads == 1 else "threads"
            parts.append(f"{self.native_threads} native {noun} ran (OpenMP/BLAS pools and the like)")
        return " and ".join(parts)

    def remedy(self) -> str:
        """What the user can change so that forking is safe, for the hazards seen."""
        steps = []
        if self.threads:
            steps.append(
                "start the loaders' workers before those threads (persistent_workers=True and a first iter() "
                "before they start), or end them before iter()"
            )
        if self.cuda_initialized:
            steps.append("create the loaders before anything touches CUDA")
        if self.compiled_frames or self.compile_workers:
            steps.append("start persistent workers before calling the compiled model")
        return "; ".join(steps)
