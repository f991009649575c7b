"""Rules about loaders that hang: workers forked into an unsafe state, and a batch that never came."""

from __future__ import annotations

from loaderdoctor.recording.forksafety import recorded_hazards
from loaderdoctor.recording.record import Recording
from loaderdoctor.rules._common import settings_snippet, workers_run_pools
from loaderdoctor.rules.finding import Finding

SAFE_START_CHANGE = {"start_method": "forkserver", "persistent_workers": True}


def fork_unsafe(rec: Recording) -> Finding | None:
    """Workers are forked while threads run, CUDA is initialised or torch.compile works in the parent: a hang
    waiting to happen. Importing a module is no hazard; what runs at fork is."""
    if rec.settings.num_workers == 0:
        return _hazards_for_new_workers(rec)
    if rec.start_method != "fork":
        return None
    hazards = recorded_hazards(rec)
    # The risk is shown by the evidence alone; a stall or a dead worker shows it happened.
    happened = (rec.stall is not None and rec.stall.hung) or bool(rec.worker_deaths)
    if not hazards.explain(happened, workers_run_pools(rec)):
        return None
    title = f"Workers are forked while {hazards.describe()}"
    title += ", and the loader failed" if happened else ": a forked worker can hang on a copied lock"
    why = (
        "A forked worker inherits every lock the parent's other threads hold, but not the threads that would "
        "release them."
    )
    remedy = hazards.remedy()
    blocker = rec.forkserver_blocker
    if blocker is None:
        change: dict[str, object] = dict(SAFE_START_CHANGE)
        fix = f"{why} Start workers with forkserver (or spawn) and keep them persistent" + (
            f", or {remedy}." if remedy else "."
        )
    else:
        # A prescription must never be a setting that fails: keep fork, and say what would make it safe.
        change = {}
        fix = (
            f"{why} forkserver cannot work for this loader yet: {blocker}. Until then keep fork"
            + (f" and {remedy}" if remedy else "")
            + "; once that is changed, use multiprocessing_context='forkserver' with persistent workers."
        )
    return Finding(
        rule="fork-unsafe",
        severity="critical" if happened else "warning",
        title=title,
        evidence={
            "threads": [t.describe() for t in hazards.threads],
            "cuda_initialized": hazards.cuda_initialized,
            "compiled_frames": hazards.compiled_frames,
            "compile_workers": hazards.compile_workers,
            "native_threads": hazards.native_threads,
            "start_method": rec.start_method,
            "forkserver_blocker": blocker,
            "stalled": rec.stall is not None,
            "worker_deaths": len(rec.worker_deaths),
        },
        fix=fix,
        snippet=settings_snippet(rec, change),
        settings_change=change,
        impact=1.0 if happened else 0.0,
    )


def _hazards_for_new_workers(rec: Recording) -> Finding | None:
    """A loader without workers, where workers forked now would inherit a hazard: said, since a fix that adds
    workers starts them with forkserver for it (rules/prescribe.py), and a start method is never changed for a
    reason the report does not name."""
    would_fork = rec.settings.replace(num_workers=1).effective_start_method == "fork"
    hazards = recorded_hazards(rec)
    if rec.settings.backend != "process" or not would_fork or not hazards or rec.forkserver_blocker is not None:
        return None
    return Finding(
        rule="fork-unsafe",
        severity="info",
        title=f"Workers forked here would start while {hazards.describe()}",
        evidence={
            "threads": [t.describe() for t in hazards.threads],
            "cuda_initialized": hazards.cuda_initialized,
            "compiled_frames": hazards.compiled_frames,
            "compile_workers": hazards.compile_workers,
            "start_method": None,
        },
        fix=(
            "A forked worker inherits every lock the parent's other threads hold, but not the threads that would "
            "release them: a fix that adds workers starts them with forkserver (persistent, so that they start "
            "once)" + (f"; or {remedy}, and keep fork." if (remedy := hazards.remedy()) else ".")
        ),
        snippet=None,
        settings_change={},
        impact=0.0,
    )


def stall(rec: Recording) -> Finding | None:
    """A batch never came: which one, how long the loop waited, and where the workers are stuck."""
    if rec.stall is None:
        return None
    stalled = rec.stall
    stuck_frames = [f for f in (s.stuck_at() for s in stalled.stacks) if f is not None]
    hazards = recorded_hazards(rec)
    if hazards.explain(True, workers_run_pools(rec)) and rec.start_method == "fork":
        fix = f"Workers were forked while {hazards.describe()}, the known cause of this hang (see fork-unsafe)."
    elif stuck_frames:
        fix = f"Look at where loading is stuck ({stuck_frames[0]}) and make it return."
    else:
        fix = "Find where loading is stuck with py-spy dump --pid on a worker."
    fix += " Pass DataLoader(timeout=...) so that a hang raises instead of waiting forever."
    title = (
        f"Batch {stalled.batch} of epoch {stalled.epoch} never came: the loop waited {stalled.waited_s:.0f} s for it"
    )
    if not stalled.hung:
        title = f"Batch {stalled.batch} of epoch {stalled.epoch} took longer than the whole measuring budget"
        fix = (
            f"Loading was still using CPU after {stalled.waited_s:.0f} s, so this looks slow rather than "
            "stuck: give the check a larger --budget, and see where the time goes"
            + (f" ({stuck_frames[0]})." if stuck_frames else ".")
        )
    return Finding(
        rule="stall",
        severity="critical" if stalled.hung else "warning",
        title=title,
        evidence={
            "epoch": stalled.epoch,
            "batch": stalled.batch,
            "waited_s": round(stalled.waited_s, 1),
            "threshold_s": round(stalled.threshold_s, 1),
            "reason": stalled.reason,
            "workers_cpu_idle": stalled.workers_cpu_idle,
            "stuck_frames": stuck_frames,
        },
        fix=fix,
        snippet=None,
        settings_change={},
        impact=1.0 if stalled.hung else 0.5,
    )
