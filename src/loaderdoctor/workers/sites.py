"""A thread inside a worker that samples where the worker's main thread spends its wall and CPU time, site by
site (see callsites.py), and keeps the totals in a small JSON file, which the probe reads back.

Every INTERVAL_S the thread reads the main thread's frame (sys._current_frames(), from inside the process: no
ptrace, no root) and its CPU clock, and gives the interval's wall and CPU time to the site where it finds it:
statistical sampling, whose shares converge on where the time goes. The file is replaced atomically every
FLUSH_S and once more when the worker exits (a worker killed hard leaves the last one).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from loaderdoctor.host.facts import OWN_THREAD_PREFIX, thread_frames
from loaderdoctor.plain.background import BackgroundThread
from loaderdoctor.plain.data import dataclass_from_dict
from loaderdoctor.workers.activity import LockCalls, WorkerActivity, WorkerSite, busiest_sites, join_activities
from loaderdoctor.workers.callsites import Site, site_of

INTERVAL_S = 0.02
FLUSH_S = 0.5
_SUFFIX = ".activity.json"


def activity_path(directory: str, pid: int) -> str:
    """Where the worker with `pid` keeps its activity in `directory`."""
    return os.path.join(directory, f"{pid}{_SUFFIX}")


def thread_cpu_clock(ident: int) -> int | None:
    """The CPU-time clock of a thread of this process (by threading ident); None where there is none."""
    try:
        return time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):  # not on this platform
        return None


class SiteProfiler:
    """Samples, every interval_s from a daemon thread, where the thread `ident` is and the CPU it used, and
    writes the totals to `path` every flush_s and at stop(). lock_calls gives the file-lock calls counted in
    this process (see filelocks.py), written with the totals."""

    def __init__(
        self,
        path: str,
        ident: int,
        cpu_clock: int,
        *,
        lock_calls: Callable[[], LockCalls] = LockCalls,
        lock_free: bool = False,
        interval_s: float = INTERVAL_S,
        flush_s: float = FLUSH_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.path = path
        self.ident = ident
        self.cpu_clock = cpu_clock
        self.lock_calls = lock_calls
        self.lock_free = lock_free
        self.interval_s = interval_s
        self.flush_s = flush_s
        self.clock = clock
        self._sites: dict[Site, list[float]] = {}  # site -> [wall_s, cpu_s, samples]
        self._idle_s = 0.0
        self._sampled_s = 0.0
        self._cpu_s = 0.0
        self._samples = 0
        self._last_wall = clock()
        self._last_cpu = time.clock_gettime(cpu_clock)
        self._lock = threading.Lock()
        self._next_flush = 0.0
        self._thread = BackgroundThread(OWN_THREAD_PREFIX + "site-profiler", self._tick, interval_s)

    def start(self) -> SiteProfiler:
        self._next_flush = self.clock() + self.flush_s
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and write the totals one last time."""
        self._thread.stop()
        self.flush()

    def _tick(self) -> None:
        self.profile_once()
        if self.clock() >= self._next_flush:
            self.flush()
            self._next_flush = self.clock() + self.flush_s

    def profile_once(self) -> None:
        """Give the time since the last sample, wall and CPU, to the site where the thread is now."""
        frame = thread_frames().get(self.ident)
        if frame is None:
            return  # the thread ended
        now = self.clock()
        try:
            cpu = time.clock_gettime(self.cpu_clock)
        except OSError:  # it ended since
            return
        site = site_of(frame)
        del frame  # a frame keeps its locals alive
        wall_s, cpu_s = now - self._last_wall, cpu - self._last_cpu
        self._last_wall, self._last_cpu = now, cpu
        with self._lock:
            self._sampled_s += wall_s
            self._cpu_s += cpu_s
            self._samples += 1
            if site is None:
                self._idle_s += wall_s
                return
            totals = self._sites.setdefault(site, [0.0, 0.0, 0])
            totals[0] += wall_s
            totals[1] += cpu_s
            totals[2] += 1

    def activity(self) -> WorkerActivity:
        """The totals so far, as one worker's WorkerActivity."""
        with self._lock:
            sites = [
                WorkerSite(site.file, site.line, site.function, site.lock, wall_s, cpu_s, int(samples))
                for site, (wall_s, cpu_s, samples) in self._sites.items()
            ]
            return WorkerActivity(
                workers=1,
                sampled_s=self._sampled_s,
                idle_s=self._idle_s,
                cpu_s=self._cpu_s,
                samples=self._samples,
                sites=busiest_sites(sites),
                lock_calls=self.lock_calls(),
                lock_free=self.lock_free,
            )

    def flush(self) -> None:
        """Replace the file with the totals so far, atomically (a reader never sees half of it)."""
        partial = f"{self.path}.{os.getpid()}.partial"
        with contextlib.suppress(OSError):  # the probe ended and took the directory away
            Path(partial).write_text(json.dumps(self.activity().to_dict()))
            os.replace(partial, self.path)


def read_worker_activity(directory: str) -> WorkerActivity | None:
    """The activity every worker wrote in `directory`, joined; None when none wrote any."""
    parts = []
    for path in sorted(Path(directory).glob(f"*{_SUFFIX}")):
        try:
            parts.append(dataclass_from_dict(WorkerActivity, json.loads(path.read_text())))
        except (OSError, ValueError, TypeError, KeyError):
            continue  # a worker that could not write its file whole
    return join_activities(parts)
