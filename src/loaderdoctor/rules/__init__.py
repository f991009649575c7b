"""The rules: pure functions Recording -> Finding | None, one concern each, and the order of their findings."""

from __future__ import annotations

from collections.abc import Callable

from loaderdoctor.recording.record import Recording
from loaderdoctor.rules.ceiling import input_ceiling
from loaderdoctor.rules.crash import worker_crash
from loaderdoctor.rules.data import duplicate_samples, sample_errors
from loaderdoctor.rules.distributed import set_epoch_never_called
from loaderdoctor.rules.finding import SEVERITIES, Finding
from loaderdoctor.rules.host import cpu_oversubscription, fd_limit, shm_capacity, stray_workers
from loaderdoctor.rules.locks import lock_contention
from loaderdoctor.rules.memory import memory_growth, pin_memory
from loaderdoctor.rules.safety import fork_unsafe, stall
from loaderdoctor.rules.throughput import input_bound, slow_start, worker_respawn

Rule = Callable[[Recording], Finding | None]

RULES: tuple[Rule, ...] = (
    stall,
    fork_unsafe,  # before worker-crash: at equal severity, the hazard that explains a death leads
    worker_crash,
    sample_errors,
    duplicate_samples,
    worker_respawn,
    slow_start,
    cpu_oversubscription,
    memory_growth,
    shm_capacity,
    fd_limit,
    stray_workers,
    pin_memory,
    lock_contention,
    set_epoch_never_called,
    input_bound,
    input_ceiling,
)

# Symptoms say what the loop suffers; causes say why. At equal severity a cause is the main diagnosis: a
# rank-straggler says which rank the others wait for, and a lock its workers wait on (a cause) says why.
SYMPTOMS = frozenset({"input-bound", "stall", "rank-straggler"})
# Causes whose cost is the wait they would explain, not a time measured on their own: where their fix was
# measured and found no fix, they explain nothing of it, and fall to info (see check.py).
ESTIMATED_CAUSES = frozenset({"cpu-oversubscription"})


def order(findings: list[Finding]) -> list[Finding]:
    """Most severe first; then causes before symptoms; then by measured impact."""
    return sorted(
        findings,
        key=lambda f: (SEVERITIES.index(f.severity), f.rule in SYMPTOMS, -f.impact),
    )


def diagnose(recording: Recording) -> list[Finding]:
    """Every rule's finding for `recording`, main diagnosis first."""
    return order([f for rule in RULES if (f := rule(recording)) is not None])
