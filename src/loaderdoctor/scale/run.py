"""scale(): measure the loaders of a target under each rank count (one elastic launch each), join what the
ranks measured, and prove a lock's cost by launching again with read-only locks made no-ops."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from loaderdoctor.errors import LoaderDoctorError, UsageError
from loaderdoctor.loader.ddp import DdpPlan, ddp_plan
from loaderdoctor.probe.budget import check_budget, target_limit_s
from loaderdoctor.probe.verdict import MIN_SPEEDUP
from loaderdoctor.report import Verification
from loaderdoctor.rules.locks import lock_free_provable
from loaderdoctor.scale import join
from loaderdoctor.scale.launch import launch
from loaderdoctor.scale.order import LaunchOrder, Topology
from loaderdoctor.scale.report import ScaleLoaderReport, ScaleReport
from loaderdoctor.scale.results import LaunchResult
from loaderdoctor.targets.resolve import check_target

log = logging.getLogger("loaderdoctor")

DEFAULT_RANKS = (1, 2, 4)
DEFAULT_BUDGET_S = 20.0  # per rank count
# progress(what is under way, in words)
ScaleProgress = Callable[[str], None]


def scale(
    target: str,
    *,
    ranks: Sequence[int] = DEFAULT_RANKS,
    step_ms: float | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    progress: ScaleProgress | None = None,
) -> ScaleReport:
    """Launch `target`'s loaders under each count of `ranks` per node (torch.distributed's elastic launcher,
    gloo on CPU, nccl with CUDA), the ranks stepping together as in DDP, and report per loader the aggregate
    rate, the scaling efficiency, each rank's figures, the findings across ranks and the DDP plan. The budget is
    the measuring time of each launch (one per rank count, and the lock-free proof's when a lock is found);
    each launch's start comes on top. With
    `nnodes` > 1, run the same command on every node, each with its `node_rank` and node 0's `rdzv_endpoint`."""
    if not isinstance(target, str):
        raise UsageError(
            "scale() takes a TARGET string ('pkg.module:function', 'path/to/file.py:function', 'scenario:NAME')",
            hint="every rank is a new process that builds the loaders itself: it needs a function to call",
        )
    counts = rank_counts(ranks)
    check_budget(budget_s, step_ms)
    # a target that cannot be found (or whose import never ends) fails here, before any rank starts
    check_target(target, target_limit_s(budget_s))
    Topology(counts[0], nnodes, node_rank, rdzv_endpoint)  # checks the topology before anything starts
    launches: list[LaunchResult] = []
    for index, count in enumerate(counts):
        topology = Topology(count, nnodes, node_rank, rdzv_endpoint)
        _say(progress, f"measuring under {topology.world_size} {'rank' if topology.world_size == 1 else 'ranks'}")
        launched = launch(LaunchOrder(target, budget_s, "", step_ms), topology, index=index)
        _raise_target_error(launched)
        launches.append(launched)
    names = _loader_names(launches)
    reports = {name: _loader_report(name, launches) for name in names}
    largest_launch = max(launches, key=lambda launched: launched.world_size)
    proof = [name for name in names if _lock_to_prove(reports[name], largest_launch)]
    if proof:
        largest = max(counts)
        topology = Topology(largest, nnodes, node_rank, rdzv_endpoint)
        _say(progress, f"measuring under {topology.world_size} ranks without the lock on read-only files")
        lock_free = launch(LaunchOrder(target, budget_s, "", step_ms, lock_free=True), topology, index=len(counts))
        for name in proof:
            reports[name].verification = lock_free_verification(largest_launch, lock_free, name)
    return ScaleReport(target, reports, nnodes=nnodes)


def rank_counts(ranks: Sequence[int]) -> list[int]:
    """The rank counts to measure, smallest first, each once; a UsageError for anything but whole numbers >= 1."""
    counts = sorted(set(ranks))
    if not counts or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in counts):
        raise UsageError(
            f"--ranks must be whole numbers of ranks, 1 or more, not {list(ranks)}", hint="e.g. --ranks 1,2,4"
        )
    return counts


def _say(progress: ScaleProgress | None, what: str) -> None:
    log.info("scale: %s", what)
    if progress is not None:
        progress(what)


def _raise_target_error(launched: LaunchResult) -> None:
    """The target's own error, as check would give it, when no rank could build or measure it."""
    errors = [r for r in launched.results if r.error is not None]
    if not errors or len(errors) < len(launched.results) or any(r.loaders for r in launched.results):
        return
    first = errors[0]
    if first.usage_error:
        raise UsageError(first.error or "", hint=first.hint)
    raise LoaderDoctorError(first.error or "", hint=first.hint)


def _loader_names(launches: list[LaunchResult]) -> list[str]:
    names: list[str] = []
    for launched in launches:
        for result in launched.results:
            names.extend(name for name in result.loaders if name not in names)
    if not names:
        return ["train"]  # nothing measured: the report still shows what failed, under the usual name
    return names


def _loader_report(name: str, launches: list[LaunchResult]) -> ScaleLoaderReport:
    runs = join.with_efficiencies([join.scale_run(launched, name) for launched in launches])
    return ScaleLoaderReport(name, runs, join.findings(launches, name, runs), None, _plan(name, launches))


def _plan(name: str, launches: list[LaunchResult]) -> DdpPlan | None:
    """The DDP plan of the largest world measured, from rank 0's dataset and batch size; None for a stream
    or a batch sampler of the user's (their lengths are theirs)."""
    recording = join.first_recording(launches, name)
    if recording is None or recording.dataset_len is None or not recording.batch_size:
        return None
    largest = max(launches, key=lambda launched: launched.world_size)
    loaders = join.rank_loaders(largest, name)
    drop_last = bool(loaders) and loaders[min(loaders)].facts.drop_last
    return ddp_plan(recording.dataset_len, recording.batch_size, largest.world_size, drop_last=drop_last)


def _lock_to_prove(report: ScaleLoaderReport, launched: LaunchResult) -> bool:
    """Whether lock-contention was found on a lock a lock-free launch makes no-ops (fcntl or os.lockf calls on
    files opened read-only, by the workers of every rank together)."""
    found = any(f.rule == "lock-contention" for f in report.findings)
    return found and lock_free_provable(join.ranks_activity(launched, report.name))


def lock_free_verification(before: LaunchResult, after: LaunchResult, name: str) -> Verification | None:
    """The lock-free launch against the one of the same ranks: aggregate batches per second of each, measured
    one after the other."""
    recording = join.first_recording([before], name)
    if recording is None:
        return None
    rate_before = join.aggregate_batches_per_s(before, name) or 0.0
    rate_after = join.aggregate_batches_per_s(after, name)
    ranks = after.world_size
    if rate_after is None or rate_before <= 0:
        why = "; ".join(join.failures(after, name)) or "no rate was measured"
        return Verification(
            recording.settings, rate_before, rate_after or 0.0, recording.outcome, "failed", "not-measured",
            f"not measured: {why}", source="lock-free",
        )  # fmt: skip
    speedup = rate_after / rate_before
    verdict = "faster" if speedup >= MIN_SPEEDUP else ("slower" if speedup <= 1 / MIN_SPEEDUP else "no-gain")
    where = f"at {ranks} {'rank' if ranks == 1 else 'ranks'}"
    note = (
        f"without the lock on read-only files: {speedup:.2f}x {where} (aggregate {rate_before:.1f} -> "
        f"{rate_after:.1f} batches/s, one launch of each, one after the other; the lock calls were made no-ops in "
        "the ranks' workers only, your code is unchanged)"
    )
    if verdict != "faster":
        note = f"no measurable gain without the lock on read-only files {where} ({speedup:.2f}x): it is not the cost"
    return Verification(
        recording.settings, rate_before, rate_after, recording.outcome, "completed", verdict, note, source="lock-free",
        pairs=1,
    )  # fmt: skip
