"""Join what the ranks of each launch measured: per loader, a run per rank count (each rank's figures through
report.measurements, the one notion of a rate), the efficiency against the smallest run, and the findings:
the rules of check on every rank's Recording, and the rules across ranks."""

from __future__ import annotations

import copy
import statistics

from loaderdoctor.recording.rates import training_rate
from loaderdoctor.recording.record import Recording, wait_fraction
from loaderdoctor.report import Finding, measurements
from loaderdoctor.rules import diagnose, order
from loaderdoctor.rules.distributed import distributed_sampler
from loaderdoctor.rules.locks import contended_lock, lock_finding
from loaderdoctor.rules.straggler import rank_straggler
from loaderdoctor.scale.report import RankFigures, ScaleRun
from loaderdoctor.scale.results import LaunchResult, RankLoader
from loaderdoctor.workers.activity import WorkerActivity, join_activities


def rank_loaders(launch: LaunchResult, name: str) -> dict[int, RankLoader]:
    """Each rank's measurement of loader `name` in one launch, by rank."""
    return {r.rank: r.loaders[name] for r in launch.results if name in r.loaders}


def scale_run(launch: LaunchResult, name: str) -> ScaleRun:
    """One launch's figures for loader `name` (efficiency filled in by with_efficiencies)."""
    loaders = rank_loaders(launch, name)
    per_rank = []
    for rank in range(launch.world_size):
        loader = loaders.get(rank)
        if loader is None:
            per_rank.append(RankFigures(rank, None, None, 0, "failed"))
            continue
        figures = measurements(loader.recording)
        per_rank.append(
            RankFigures(
                rank,
                figures["samples_per_s"],
                figures["wait_fraction"],
                figures["batches"],
                loader.recording.outcome,
                figures["limit"],
                figures["share_of_limit"],
            )
        )
    complete = len(loaders) == launch.world_size and all(f.samples_per_s is not None for f in per_rank)
    total = round(sum(f.samples_per_s or 0.0 for f in per_rank), 3) if complete else None
    return ScaleRun(launch.world_size, total, None, launch.world_size, per_rank, failures(launch, name))


def failures(launch: LaunchResult, name: str) -> list[str]:
    """What went wrong in a launch for loader `name`, in words: ranks that died or sent nothing, stalls,
    collectives that broke, the launch's own note."""
    said = [f.describe() for f in launch.failures]
    loaders = rank_loaders(launch, name)
    answered = {r.rank for r in launch.results}
    silent = [rank for rank in range(launch.world_size) if rank not in answered and not _named(launch, rank)]
    if silent and launch.results:
        said.append(f"{_ranks(silent)} sent no result")
    for rank, loader in sorted(loaders.items()):
        stall = loader.recording.stall
        if stall is not None:
            where = next((s.stuck_at() for s in stall.stacks if s.stuck_at()), None)
            said.append(
                f"rank {rank}'s loader stalled at epoch {stall.epoch} batch {stall.batch}"
                + (f" ({where})" if where else "")
            )
        elif loader.recording.outcome == "crashed":
            said.append(f"rank {rank}'s loader crashed: {loader.recording.error or 'a worker died'}")
    broken = sorted(rank for rank, loader in loaders.items() if loader.collective_error)
    if broken and not said:
        said.append(f"the collective of {_ranks(broken)} failed: {loaders[broken[0]].collective_error}")
    if launch.note:
        said.append(launch.note)
    return said


def _named(launch: LaunchResult, rank: int) -> bool:
    return any(f.rank == rank for f in launch.failures)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def with_efficiencies(runs: list[ScaleRun]) -> list[ScaleRun]:
    """The runs with their efficiency against the smallest run that measured an aggregate rate."""
    measured = [run for run in runs if run.samples_per_s]
    if not measured:
        return runs
    base = min(measured, key=lambda run: run.ranks)
    for run in runs:
        run.base_ranks = base.ranks
        if run.samples_per_s is not None and base.samples_per_s:
            run.efficiency = round(run.samples_per_s / (base.samples_per_s * run.ranks / base.ranks), 3)
    return runs


def findings(launches: list[LaunchResult], name: str, runs: list[ScaleRun] | None = None) -> list[Finding]:
    """The findings for loader `name`: those of check's rules on every rank of the largest launch that measured
    (one per rule: the most costly rank's, with the ranks it holds for), and the rules across its ranks: the
    split of the samples, a rank that the others wait for (rank-straggler), and a lock that every rank's workers
    wait on (with `runs`, what it costs the scaling)."""
    measured = [launch for launch in launches if rank_loaders(launch, name)]
    if not measured:
        return []
    largest = max(measured, key=lambda launch: launch.world_size)
    loaders = rank_loaders(largest, name)
    by_rule: dict[str, tuple[Finding, list[int]]] = {}
    by_rank = {rank: diagnose(loader.recording) for rank, loader in loaders.items()}
    for rank in sorted(loaders):
        for finding in by_rank[rank]:
            if finding.rule == "lock-contention":
                continue  # judged on every rank's workers together, below
            kept = by_rule.get(finding.rule)
            if kept is None:
                by_rule[finding.rule] = (finding, [rank])
            else:
                best = finding if finding.impact > kept[0].impact else kept[0]
                by_rule[finding.rule] = (best, [*kept[1], rank])
    joined = []
    for finding, ranks in by_rule.values():
        finding = copy.copy(finding)
        finding.evidence = {**finding.evidence, "ranks": ranks, "world_size": largest.world_size}
        joined.append(finding)
    across = distributed_sampler({rank: loader.facts for rank, loader in loaders.items()})
    if across is not None:
        joined.append(across)
    hosts = {result.rank: result.host for result in largest.results}
    straggler = rank_straggler({rank: loader.recording for rank, loader in loaders.items()}, hosts, by_rank)
    if straggler is not None:
        joined.append(straggler)
    lock = lock_across_ranks(measured, name, runs or [])
    if lock is not None:
        joined.append(lock)
    return order(joined)


def ranks_activity(launch: LaunchResult, name: str) -> WorkerActivity | None:
    """What the workers of every rank of a launch did, as one (see activity.join_activities)."""
    loaders = rank_loaders(launch, name).values()
    return join_activities([a for loader in loaders if (a := loader.recording.worker_activity) is not None])


def lock_across_ranks(launches: list[LaunchResult], name: str, runs: list[ScaleRun]) -> Finding | None:
    """lock-contention judged on the workers of every rank of the largest launch, with the share of their time
    spent waiting at the same lock in the smallest launch, and the largest run's scaling efficiency."""
    largest = max(launches, key=lambda launch: launch.world_size)
    activity = ranks_activity(largest, name)
    if activity is None:
        return None
    recordings = [loader.recording for loader in rank_loaders(largest, name).values()]
    waits = [w for rec in recordings if (w := wait_fraction(rec)) is not None]
    finding = lock_finding(activity, statistics.mean(waits) if waits else None)
    if finding is None:
        return None
    evidence = {**finding.evidence, "world_size": largest.world_size}
    smallest = min(launches, key=lambda launch: launch.world_size)
    site = contended_lock(activity)
    if smallest is not largest and site is not None:
        before = ranks_activity(smallest, name)
        found = None if before is None else contended_lock(before)
        same_site = found is not None and found[0].where() == site[0].where()
        evidence[f"waiting_share_at_{smallest.world_size}_ranks"] = round(found[1], 3) if same_site else 0.0
    evidence[f"waiting_share_at_{largest.world_size}_ranks"] = finding.evidence["waiting_share"]
    run = next((r for r in runs if r.ranks == largest.world_size), None)
    if run is not None and run.efficiency is not None and run.base_ranks < run.ranks:
        evidence["efficiency"] = run.efficiency
        finding.title += f"; {run.ranks} ranks scale at {run.efficiency:.2f}"
    finding.evidence = evidence
    return finding


def aggregate_batches_per_s(launch: LaunchResult, name: str) -> float | None:
    """The ranks' training rates (batches per second) added up; None unless every rank measured one."""
    loaders = rank_loaders(launch, name)
    rates = [training_rate(loader.recording) for loader in loaders.values()]
    if len(rates) < launch.world_size or any(rate is None for rate in rates):
        return None
    return sum(rate for rate in rates if rate is not None)


def first_recording(launches: list[LaunchResult], name: str) -> Recording | None:
    """Rank 0's Recording of loader `name` in the largest launch that has one (its settings, its dataset)."""
    for launch in sorted(launches, key=lambda launch: -launch.world_size):
        loaders = rank_loaders(launch, name)
        if loaders:
            return loaders[min(loaders)].recording
    return None
