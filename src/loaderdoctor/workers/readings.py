"""What the poller sees of worker processes from outside, as plain data: their memory and CPU, the machine's CPU
beside them, and a process's stack."""

from __future__ import annotations

from dataclasses import dataclass

from loaderdoctor.plain.frames import StackFrame


@dataclass
class WorkerReading:
    t_s: float  # seconds since the run started
    pid: int
    uss_bytes: int | None  # private memory; None where the round read the CPU only (a measuring window's edges)
    rss_bytes: int
    cpu_s: float
    threads: int
    # Seconds its threads were runnable but waiting for a CPU, since it started (schedstat's run delay); None
    # where the kernel does not count it, and in reports saved before it was recorded.
    run_delay_s: float | None = None
    # CPU seconds each of its threads has used since it started, by thread id (its main thread's is its pid), to
    # tell threads that compute from a pool that sleeps; None where /proc was not read, and in reports saved before.
    thread_cpu_s: dict[str, float] | None = None


@dataclass
class HostReading:
    """The whole machine's CPU and the training process's at one moment, to tell other processes' load apart."""

    t_s: float  # seconds since the run started
    busy_cpu_s: float  # CPU seconds all processes of the machine have used, since boot
    main_cpu_s: float  # CPU seconds the training process has used (all its threads), since it started
    main_run_delay_s: float | None = None  # seconds its threads were runnable but not running (None: not counted)


@dataclass
class WorkerStack:
    pid: int  # the worker's pid; the main process's own pid when loading ran there
    frames: list[StackFrame]  # innermost first
    stuck_frame: StackFrame | None  # the innermost frame in the user's code

    def stuck_at(self) -> str | None:
        """Where this process is stuck, as every report words it: "pid N at FRAME", with the innermost frame of
        the user's code, else the innermost frame; None without frames."""
        frame = self.stuck_frame or (self.frames[0] if self.frames else None)
        return None if frame is None else f"pid {self.pid} at {frame}"
