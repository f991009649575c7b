"""The probe's hook, run first in each worker process: the index in hand noted, stacks dumped on a signal,
file-lock calls watched (made no-ops on read-only files in a lock-free run), and where the worker's main thread
spends its time sampled."""

from __future__ import annotations

import multiprocessing.util
import os
import threading
import time

from loaderdoctor.workers.currentindex import InHand
from loaderdoctor.workers.filelocks import FileLockWatch
from loaderdoctor.workers.poller import StackDumpHook
from loaderdoctor.workers.sites import SiteProfiler, activity_path, thread_cpu_clock

# Runs before multiprocessing's own exit finalizers of lower priority, while the worker is still whole.
_EXIT_PRIORITY = 10
# The threads the hook starts in each worker (the site profiler, where threads have a CPU clock of their own):
# not the worker's own, when its threads are counted.
THREADS_PER_WORKER = 1 if hasattr(time, "pthread_getcpuclockid") else 0


class ProbeWorkerHook:
    """worker_hook of LoaderSpec.build for the probe: everything it leaves goes to files in `dump_dir` (the
    stacks, see workers.py; the activity, read back with sites.read_worker_activity)."""

    def __init__(self, dump_dir: str, *, lock_free: bool = False, in_hand: InHand | None = None) -> None:
        self.dump_dir = dump_dir
        self.lock_free = lock_free
        self.in_hand = in_hand  # the dataset's (pickled with it): each worker notes there the index it loads

    def __call__(self, worker_id: int) -> None:
        if self.in_hand is not None:
            self.in_hand.attach(worker_id)
        StackDumpHook(self.dump_dir)(worker_id)
        watch = FileLockWatch(lock_free=self.lock_free)
        watch.install()  # for the worker's whole life: the process ends with it
        ident = threading.get_ident()  # the worker loop's thread: the hook runs in it
        cpu_clock = thread_cpu_clock(ident)
        if cpu_clock is None:
            return  # without a thread's CPU clock, waiting cannot be told from computing: no sampling
        profiler = SiteProfiler(
            activity_path(self.dump_dir, os.getpid()),
            ident,
            cpu_clock,
            lock_calls=watch.counts,
            lock_free=self.lock_free,
        )
        profiler.start()
        multiprocessing.util.Finalize(None, profiler.stop, exitpriority=_EXIT_PRIORITY)
