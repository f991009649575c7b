"""Shared by the tests that kill or end a process started in a session of its own: what of that session lives."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def session_processes(sid: int) -> dict[int, str]:
    """The processes of session `sid` (Linux, from /proc) that have not exited (zombies left out), with the start
    of their command lines: a process started with start_new_session=True and everything it started since."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            if int(stat[3]) == sid and stat[0] not in ("Z", "X"):
                found[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:150]
        except (OSError, IndexError, ValueError):
            continue
    return found


def kill_session(sid: int) -> None:
    """SIGKILL every process left in session `sid`: a test's own clean-up, whatever it found."""
    for pid in session_processes(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
