"""Worker processes seen from outside: periodic readings of their memory, CPU and threads (the poller), and their
stacks."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import psutil

from loaderdoctor.host.facts import OWN_THREAD_PREFIX, thread_frames
from loaderdoctor.plain.background import BackgroundThread
from loaderdoctor.plain.frames import StackFrame
from loaderdoctor.plain.usercode import is_user_frame
from loaderdoctor.workers.processes import note_killed
from loaderdoctor.workers.readings import HostReading, WorkerReading, WorkerStack

STACK_SIGNAL = signal.SIGUSR1
_DUMP_WAIT_S = 1.0
# A worker that uses less than this share of a core is idle: one blocked on a lock uses none of its own, but
# check's site profiler (workers/sites.py) wakes in it 100 times a second, 1-2% of a core measured here.
IDLE_CORE_SHARE = 0.05
# A round of readings costs this process what the kernel takes to build each worker's USS (/proc/PID/smaps_rollup:
# a walk over its pages, 7 ms for a worker that imported torch and 30 ms for one holding 2 GB here; the rest of
# a round is under 0.5 ms a worker). Eight such 2 GB workers every 0.25 s took a core from the training loop.
# The next round waits until rounds take at most this share of a core, and never longer than MAX_INTERVAL_S
# (the watchdog tells idle workers by their CPU over 4 s: it needs two rounds within that).
MAX_SAMPLING_SHARE = 0.05
MAX_INTERVAL_S = 2.0


def machine_busy_cpu_s() -> float:
    """CPU seconds all processes of the machine have used since boot (every core's time not idle). A virtual
    machine's steal (its cores' time the hypervisor gave to others) is no process of this machine: it grows with
    this machine's own use (here 0.13 cores beside a loop keeping 0.22 busy, 0.01 when quiet), and counted it
    read as other processes' load that no process here took."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    outside = sum(getattr(times, name, 0.0) for name in ("guest", "guest_nice", "steal"))
    return sum(times) - idle - outside


def parse_run_delay_s(text: str) -> float | None:
    """The run delay in seconds from one thread's /proc/PID/task/TID/schedstat ("ns on a CPU, ns runnable but
    waiting for one, times run"); None where the text is not that, or reads "0 0 0": the kernel's words for
    counts it does not keep (a thread that exists has run at least once)."""
    try:
        on_cpu_ns, run_delay_ns, timeslices = (int(field) for field in text.split()[:3])
    except ValueError:
        return None
    if on_cpu_ns == run_delay_ns == timeslices == 0:
        return None
    return run_delay_ns / 1e9


def run_delay_s(pid: int, proc: Path = Path("/proc")) -> float | None:
    """Seconds the live threads of process `pid` have spent runnable but not running (ready, while other
    processes or its own threads held the cores), summed from their schedstat; None where the kernel does not
    count it or the process is gone. Time descheduled so is neither computing nor waiting on I/O."""
    try:
        threads = os.listdir(proc / str(pid) / "task")
    except OSError:
        return None
    delays = []
    for tid in threads:
        try:
            delays.append(parse_run_delay_s((proc / str(pid) / "task" / tid / "schedstat").read_text()))
        except OSError:
            continue  # a thread that ended meanwhile
    known = [d for d in delays if d is not None]
    return sum(known) if known else None


def thread_counts(pid: int, proc: Path = Path("/proc")) -> tuple[float | None, dict[str, float] | None]:
    """(the run delay of process `pid`'s live threads together, as run_delay_s gives it; each of its threads' CPU
    seconds since it started, by thread id), in one pass over /proc/PID/task; (None, None) where the process is
    gone. A thread that ends meanwhile is left out of both."""
    task = proc / str(pid) / "task"
    try:
        threads = os.listdir(task)
    except OSError:
        return None, None
    delays: list[float] = []
    cpu: dict[str, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for tid in threads:
        try:
            delay = parse_run_delay_s((task / tid / "schedstat").read_text())
            fields = (task / tid / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if delay is not None:
            delays.append(delay)
        with contextlib.suppress(ValueError, IndexError):
            cpu[tid] = (int(fields[11]) + int(fields[12])) / ticks  # utime and stime
    return (sum(delays) if delays else None), cpu


_THREAD = threading.local()  # each thread's own open /proc/thread-self/schedstat (closed as the thread ends)


def thread_run_delay_s() -> float | None:
    """Seconds the calling thread has spent runnable but not running, from its schedstat (kept open per thread:
    about 2 us a read); None where the kernel does not count it."""
    reader = getattr(_THREAD, "schedstat", None)
    if reader is None:
        try:
            reader = _THREAD.schedstat = _ThreadFile(os.open("/proc/thread-self/schedstat", os.O_RDONLY))
        except OSError:
            reader = _THREAD.schedstat = False
    if reader is False:
        return None
    try:
        return parse_run_delay_s(os.pread(reader.fd, 128, 0).decode())
    except OSError:
        return None


class _ThreadFile:
    """A thread's open file, closed quietly when the thread's locals go (a file object left open until the
    interpreter ends is a ResourceWarning)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class WorkerPoller:
    """A background thread that samples, every interval while active (longer where a round would take more than
    MAX_SAMPLING_SHARE of a core), each worker's USS/RSS, CPU time (its threads' too), run
    delay and thread count (less `own_threads`, the threads loaderdoctor itself runs in each worker), and the
    machine's and the training process's CPU (to tell other processes' load apart) and its run delay. With
    `keep_rounds`, a long run keeps at most about that many rounds of readings: past it, every other round taken
    so far is dropped (the memory of a watched run of days stays bounded; growth and CPU are read from the
    rounds that stay)."""

    def __init__(
        self,
        pids: Callable[[], list[int]],
        *,
        interval_s: float = 0.25,
        clock: Callable[[], float] = time.perf_counter,
        t0: float | None = None,
        own_threads: int = 0,
        keep_rounds: int | None = None,
    ) -> None:
        self._pids = pids
        self._keep_rounds = keep_rounds
        self._round_times: list[float] = []
        self._own_threads = own_threads
        self._clock = clock
        self._t0 = clock() if t0 is None else t0
        self._processes: dict[int, psutil.Process] = {}
        self._own = psutil.Process()
        self._active = threading.Event()
        self._active.set()
        self._lock = threading.Lock()
        self.readings: list[WorkerReading] = []
        self.host_readings: list[HostReading] = []
        self._interval_s = interval_s
        self._thread = BackgroundThread(OWN_THREAD_PREFIX + "poller", self._tick, interval_s)

    def start(self) -> WorkerPoller:
        self._thread.start()
        return self

    def stop(self) -> list[WorkerReading]:
        """Stop sampling (from any thread, the poller's own included); the readings taken."""
        self._thread.stop()
        return self.readings

    def poll_soon(self) -> None:
        """A round now, whatever the spacing: new workers' private memory read as their start-up ends, which is
        where their growth is measured from (a round up to MAX_INTERVAL_S later would leave out what they copied
        meanwhile)."""
        self._thread.wake()

    def pause(self) -> None:
        """Stop sampling until resume(), with a last sample now (idle workers need no watching meanwhile): CPU to
        close the window, and private memory, which the loop no longer waits on (the last reading of growth)."""
        if self._active.is_set():
            self.poll_once()
            self._active.clear()

    def resume(self) -> None:
        """Sample again, starting with one of CPU now."""
        if not self._active.is_set():
            self._active.set()
            self.poll_once(private_memory=False)

    def _tick(self) -> None:
        if self._active.is_set():
            cpu_before = time.thread_time()
            self.poll_once()
            cost_s = time.thread_time() - cpu_before
            self._thread.interval_s = min(MAX_INTERVAL_S, max(self._interval_s, cost_s / MAX_SAMPLING_SHARE))

    def poll_once(self, *, private_memory: bool = True) -> None:
        """One round: every worker, the machine and this process, stamped alike. Without `private_memory`, no
        worker's USS is read (None): that read is most of a round's cost (MAX_SAMPLING_SHARE), and a measuring
        window's edges need the CPU only, without keeping the loop from its batches while its workers run ahead."""
        t_s = self._clock() - self._t0
        taken = []
        for pid in self._pids():
            try:
                proc = self._processes.get(pid) or self._processes.setdefault(pid, psutil.Process(pid))
                with proc.oneshot():
                    memory = proc.memory_full_info() if private_memory else proc.memory_info()
                    cpu = proc.cpu_times()
                    threads = max(1, proc.num_threads() - self._own_threads)
            except (psutil.Error, OSError):
                continue  # a worker that ended between listing and sampling
            if memory.rss == 0:  # one exiting: its memory is given back, and it is no sample of a running worker
                continue
            cpu_s = cpu.user + cpu.system
            uss = memory.uss if private_memory else None
            delay, thread_cpu = thread_counts(pid)
            taken.append(WorkerReading(t_s, pid, uss, memory.rss, cpu_s, threads, delay, thread_cpu))
        try:
            own = self._own.cpu_times()
            host = HostReading(t_s, machine_busy_cpu_s(), own.user + own.system, run_delay_s(self._own.pid))
        except (psutil.Error, OSError):
            host = None
        with self._lock:
            self.readings.extend(taken)
            if host is not None:
                self.host_readings.append(host)
            if self._keep_rounds is not None:
                self._round_times.append(t_s)
                if len(self._round_times) > self._keep_rounds:
                    self._thin()

    def _thin(self) -> None:
        """Drop every other round of readings taken so far (the first and the latest stay)."""
        kept = set(self._round_times[::2]) | {self._round_times[-1]}
        self._round_times = sorted(kept)
        self.readings = [s for s in self.readings if s.t_s in kept]
        self.host_readings = [s for s in self.host_readings if s.t_s in kept]

    def cpu_idle(self, pids: list[int], window_s: float, max_core_share: float = IDLE_CORE_SHARE) -> bool | None:
        """Whether none of `pids` used more than max_core_share of a core over the last window_s; None if
        unknown."""
        with self._lock:
            readings = list(self.readings)
        if not readings:
            return None
        now = readings[-1].t_s
        for pid in pids:
            series = [s for s in readings if s.pid == pid]
            recent = [s for s in series if s.t_s >= now - window_s]
            if not series or series[0].t_s > now - window_s or len(recent) < 2:
                return None  # not watched long enough to say
            if recent[-1].cpu_s - recent[0].cpu_s > max_core_share * (recent[-1].t_s - recent[0].t_s):
                return False
        return True


class StackDumpHook:
    """Runs first in each worker: makes it write all its threads' stacks to a file on STACK_SIGNAL."""

    def __init__(self, dump_dir: str) -> None:
        self.dump_dir = dump_dir

    def __call__(self, worker_id: int) -> None:
        path = _dump_path(self.dump_dir, os.getpid())
        pending = path.with_suffix(".starting")
        # The file object must outlive this call: faulthandler writes to its descriptor from a signal handler.
        global _dump_file
        _dump_file = open(pending, "w")  # noqa: SIM115
        faulthandler.register(STACK_SIGNAL, file=_dump_file, all_threads=True)
        # The file takes its name once the handler is in place: a worker that has no file yet (a spawned one
        # still importing, or dying before its hook ran) would be ended by STACK_SIGNAL's default action.
        os.replace(pending, path)


def _dump_path(dump_dir: str, pid: int) -> Path:
    return Path(dump_dir) / f"{pid}.txt"


_dump_file = None
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+)$')


def parse_faulthandler(text: str) -> list[StackFrame]:
    """The frames (innermost first) of the thread that runs the worker loop, from a faulthandler dump."""
    threads: list[list[StackFrame]] = []
    for line in text.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            threads.append([])
        elif (match := _FRAME.match(line)) and threads:
            threads[-1].append(StackFrame(match["file"], int(match["line"]), match["function"].strip()))
    for frames in threads:
        if any(f.function == "_worker_loop" for f in frames):
            return frames
    return threads[0] if threads else []


def stuck_frame(frames: list[StackFrame]) -> StackFrame | None:
    """The innermost frame in the user's code, where a stuck worker is waiting. In a worker only the frames its
    loop called count: a forked worker's stack also holds the parent's frames, copied by fork, below the loop."""
    loop = next((i for i, f in enumerate(frames) if f.function == "_worker_loop"), len(frames))
    return next((f for f in frames[:loop] if is_user_frame(f)), None)


def kill_workers(pids: list[int]) -> None:
    """SIGKILL the workers: a stuck worker may ignore anything gentler. The DataLoader then notices that they
    died and raises in the next() that waits on them."""
    note_killed(pids)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def dump_worker_stacks(pids: list[int], dump_dir: str, wait_s: float = _DUMP_WAIT_S) -> list[WorkerStack]:
    """Ask each worker for its stacks (STACK_SIGNAL, see StackDumpHook) and read them back."""
    # Only a worker whose hook has named its file can take the signal (see StackDumpHook); the others have no
    # stack to give, and the signal would end them, hiding why they had not started.
    paths = {pid: path for pid in pids if (path := _dump_path(dump_dir, pid)).exists()}
    for pid in list(paths):
        try:
            os.kill(pid, STACK_SIGNAL)
        except OSError:
            del paths[pid]
    # faulthandler writes the whole dump at once from its signal handler: wait until every file has text.
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not all(p.exists() and p.stat().st_size for p in paths.values()):
        time.sleep(0.02)
    time.sleep(0.05)
    texts = {pid: path.read_text() if path.exists() else "" for pid, path in paths.items()}
    stacks = []
    for pid in pids:
        frames = parse_faulthandler(texts.get(pid, ""))
        stacks.append(WorkerStack(pid=pid, frames=frames, stuck_frame=stuck_frame(frames)))
    return stacks


def thread_cpu_s(thread: threading.Thread) -> float | None:
    """CPU seconds a thread of this process has used, from /proc; None where that cannot be read."""
    try:
        fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime and stime
    except (OSError, ValueError, IndexError):
        return None


def thread_idle(thread: threading.Thread, window_s: float = 0.5, min_cpu_s: float = 0.02) -> bool | None:
    """Whether a thread uses no CPU over the next window_s (None when unknown): a stuck one does not."""
    before = thread_cpu_s(thread)
    time.sleep(window_s)
    after = thread_cpu_s(thread)
    return None if before is None or after is None else after - before < min_cpu_s


def thread_stack(thread: threading.Thread) -> WorkerStack:
    """The current stack of a thread of this process (the main one, when loading runs there)."""
    frame = thread_frames().get(thread.ident or -1)
    summary = traceback.extract_stack(frame) if frame is not None else []
    frames = [StackFrame(f.filename, f.lineno or 0, f.name) for f in reversed(summary)]
    return WorkerStack(pid=os.getpid(), frames=frames, stuck_frame=stuck_frame(frames))
