"""How the guard words settings and stuck workers in its events and errors."""

from __future__ import annotations

from loaderdoctor.recording import WorkerStack


def stuck_text(stacks: list[WorkerStack]) -> str:
    """Where each worker is stuck, as the guard's messages name it."""
    stuck = [f"pid {s.pid} at {frame}" for s in stacks if (frame := s.stuck_frame) is not None]
    if stuck:
        return "; ".join(stuck)
    if stacks:
        return "no frame of the user's code in the stacks (pids " + ", ".join(str(s.pid) for s in stacks) + ")"
    return "no stack could be taken"
