"""scale's pieces without launching ranks: the topology and its errors, the rule across ranks, the join of the
ranks' results into runs and efficiencies, the report's JSON, and a rank's step in a group of one."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from recordings import make_recording

from loaderdoctor.cli import main
from loaderdoctor.errors import StopMeasuring, UsageError
from loaderdoctor.loader.facts import LoaderFacts, loader_facts
from loaderdoctor.recording.record import StackFrame, Stall, WorkerStack
from loaderdoctor.rules.distributed import distributed_sampler, shared_share
from loaderdoctor.scale import join
from loaderdoctor.scale.order import LaunchOrder, Topology, endpoint_parts
from loaderdoctor.scale.rank import RankStep
from loaderdoctor.scale.report import ScaleLoaderReport, ScaleReport
from loaderdoctor.scale.results import LaunchResult, RankFailure, RankLoader, RankResult
from loaderdoctor.scale.run import rank_counts, scale


def _facts(rank: int, world: int, *, distributed: bool, size: int = 100, **changes) -> LoaderFacts:
    indices = list(range(rank, size, world)) if distributed else list(range(size))
    facts = LoaderFacts(
        sampler="DistributedSampler" if distributed else "RandomSampler",
        distributed=distributed,
        iterable=False,
        batches_per_epoch=len(indices) // 10,
        dataset_len=size,
        drop_last=False,
        indices=indices,
    )
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


# The topology and the rank counts


def test_rank_counts_are_sorted_once_each_and_refused_when_not_whole_numbers():
    assert rank_counts([4, 1, 2, 2]) == [1, 2, 4]
    for bad in ([], [0], [1, -2], [1.5], [True]):
        with pytest.raises(UsageError, match="--ranks"):
            rank_counts(bad)


def test_a_topology_across_nodes_needs_an_endpoint_and_a_node_rank_within_it():
    assert Topology(2, nnodes=3, node_rank=1, rdzv_endpoint="10.0.0.1:29500").world_size == 6
    with pytest.raises(UsageError, match="--rdzv-endpoint"):
        Topology(1, nnodes=2)
    with pytest.raises(UsageError, match="--node-rank must be from 0 to 1"):
        Topology(1, nnodes=2, node_rank=2, rdzv_endpoint="h:1")
    with pytest.raises(UsageError, match="HOST:PORT"):
        Topology(1, rdzv_endpoint="nohost")
    assert endpoint_parts("[::1]:29500") == ("::1", 29500)


def test_a_target_that_cannot_be_found_fails_before_any_rank_starts():
    with pytest.raises(UsageError, match="nope"):
        scale("nope.module:make", ranks=[1], budget_s=1)
    with pytest.raises(UsageError, match="no built-in scenario named 'nope'"):
        scale("scenario:nope", ranks=[1], budget_s=1)


def test_a_rank_job_loads_back_from_its_json():
    launch_order = LaunchOrder("scenario:healthy", 5.0, "/tmp/x", step_ms=20.0, lock_free=True)
    assert LaunchOrder.from_json(launch_order.to_json()) == launch_order


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["scale", "--ranks", "1,x"], "--ranks must be rank counts separated by commas"),
        (["scale", "--ranks", "0"], "--ranks must be rank counts of 1 or more"),
        (["scale", "--nnodes", "2"], "--rdzv-endpoint"),
        (["scale", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank must be from 0"),
        (["scale", "--budget", "0"], "--budget must be more than 0 seconds"),
    ],
)
def test_scale_refuses_bad_arguments_in_the_users_words(argv, words, capsys):
    assert main(argv) == 2
    assert words in capsys.readouterr().err


# The rule across ranks


def test_ranks_without_a_distributed_sampler_load_the_same_samples():
    finding = distributed_sampler({r: _facts(r, 2, distributed=False) for r in range(2)})
    assert finding is not None and finding.rule == "distributed-sampler" and finding.severity == "critical"
    assert finding.evidence["shared_samples_share"] == 1.0
    assert finding.evidence["samples_per_rank"] == 100
    assert "DistributedSampler(dataset" in (finding.snippet or "")


def test_ranks_with_a_distributed_sampler_or_a_split_of_their_own_get_no_finding():
    assert distributed_sampler({r: _facts(r, 2, distributed=True) for r in range(2)}) is None
    # A sampler of the user's that splits by rank without DistributedSampler's attributes: the indices tell.
    split = {r: _facts(r, 2, distributed=False, indices=list(range(r, 100, 2))) for r in range(2)}
    assert distributed_sampler(split) is None
    assert distributed_sampler({0: _facts(0, 1, distributed=False)}) is None  # one rank: nothing to split


def test_a_stream_read_whole_by_every_rank_is_found_by_its_fingerprints():
    same = {r: _facts(r, 2, distributed=False, iterable=True, indices=None, fingerprints=[1, 2, 3, 4]) for r in (0, 1)}
    finding = distributed_sampler(same)
    assert finding is not None and finding.evidence["iterable"] is True
    split = {
        0: _facts(0, 2, distributed=False, iterable=True, indices=None, fingerprints=[1, 3]),
        1: _facts(1, 2, distributed=False, iterable=True, indices=None, fingerprints=[2, 4]),
    }
    assert distributed_sampler(split) is None


def test_ranks_that_take_different_numbers_of_steps_are_named_first():
    facts = {0: _facts(0, 2, distributed=True), 1: _facts(1, 2, distributed=True, batches_per_epoch=4)}
    finding = distributed_sampler(facts)
    assert finding is not None and finding.evidence["batches_per_epoch"] == {"0": 5, "1": 4}
    assert "different numbers of steps" in finding.title


def test_the_shared_share_is_the_mean_over_ranks_of_samples_another_rank_got():
    assert shared_share({0: [1, 2], 1: [2, 3]}) == 0.5
    assert shared_share({0: [1, 2], 1: []}) is None


# Joining the ranks' results


def _launch(
    world: int, *, wait_s: float = 0.001, failures: list[RankFailure] | None = None, missing=()
) -> LaunchResult:
    results = [
        RankResult(
            rank, rank, world, "host", 100 + rank,
            loaders={"train": RankLoader(make_recording(wait_s=wait_s), _facts(rank, world, distributed=True))},
        )
        for rank in range(world) if rank not in missing
    ]  # fmt: skip
    return LaunchResult(world, world, results, failures or [])


def test_a_run_adds_the_ranks_rates_and_the_efficiency_compares_with_the_smallest_run():
    one = join.scale_run(_launch(1), "train")
    two = join.scale_run(_launch(2, wait_s=0.05), "train")  # each rank waits as long as it steps: half the rate
    join.with_efficiencies([one, two])
    assert one.efficiency == 1.0
    assert two.samples_per_s == pytest.approx(sum(r.samples_per_s for r in two.per_rank))
    assert two.efficiency == round(two.samples_per_s / (2 * one.samples_per_s), 3)
    assert two.efficiency == pytest.approx(0.5, abs=0.05)  # two ranks at about half the rate each
    assert [r.rank for r in two.per_rank] == [0, 1]
    assert two.per_rank[0].wait_fraction == pytest.approx(0.5, abs=0.02)
    # Each rank states its own share of the host's limit: 2 workers at 0.8 of a core for 10 batches/s cost 0.16
    # CPU seconds a batch, so 2 cores load 12.5 batches/s at most (the 50 ms step would allow 20).
    assert two.per_rank[0].limit["binds"] == "loading-cpu"
    assert two.per_rank[0].share_of_limit == pytest.approx(10 / 12.5, abs=0.05)


def test_a_rank_that_sent_nothing_leaves_no_aggregate_and_is_named():
    killed = RankFailure(1, -9, "SIGKILL", "")
    run = join.scale_run(_launch(2, failures=[killed], missing=(1,)), "train")
    assert run.samples_per_s is None and run.efficiency is None
    assert run.per_rank[1].outcome == "failed"
    assert run.failures == ["rank 1 was killed by SIGKILL"]


def test_a_stalled_rank_is_named_with_where_it_is_stuck():
    stuck = WorkerStack(
        7, [StackFrame("/data/pose.py", 41, "__getitem__")], StackFrame("/data/pose.py", 41, "__getitem__")
    )
    launch = _launch(2)
    launch.results[1].loaders["train"].recording.stall = Stall(1, 16, 12.0, 10.0, "no batch", [stuck])
    launch.results[1].loaders["train"].recording.outcome = "stalled"
    (said,) = join.failures(launch, "train")
    assert said == "rank 1's loader stalled at epoch 1 batch 16 (pid 7 at /data/pose.py:41 in __getitem__)"


def test_findings_of_every_rank_are_joined_once_per_rule_with_the_ranks_they_hold_for():
    slow = _launch(2, wait_s=0.2)
    findings = join.findings([_launch(1), slow], "train")
    (input_bound,) = [f for f in findings if f.rule == "input-bound"]
    assert input_bound.evidence["ranks"] == [0, 1] and input_bound.evidence["world_size"] == 2


def test_the_scale_report_has_the_schemas_keys_and_its_exit_status():
    runs = join.with_efficiencies([join.scale_run(_launch(1), "train"), join.scale_run(_launch(2), "train")])
    report = ScaleReport("scenario:x", {"train": ScaleLoaderReport("train", runs, [], None, None)})
    document = json.loads(json.dumps(report.to_dict()))
    assert document["schema"] == "loaderdoctor.scale/1"
    (_, run2) = document["loaders"]["train"]["runs"]
    assert set(run2) >= {"ranks", "samples_per_s", "efficiency", "per_rank"}
    assert set(run2["per_rank"][0]) >= {"rank", "samples_per_s", "wait_fraction", "batches"}
    assert report.exit_status == 0


# A rank's step, in a process group of one


@pytest.fixture
def group_of_one(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_the_step_votes_to_stop_once_its_budget_is_spent(group_of_one):
    step = RankStep(None, budget_s=0.0, device=torch.device("cpu"))
    with pytest.raises(StopMeasuring):
        step(torch.zeros(2))
    assert step.stopped
    step.farewell()  # after the agreed stop: no more collectives (a second vote would find no partner)
    patient = RankStep(None, budget_s=60.0, device=torch.device("cpu"))
    patient(torch.zeros(2))
    assert not patient.stopped


def test_a_loaders_facts_name_its_sampler_and_the_indices_it_gives(group_of_one):
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = TensorDataset(torch.arange(10))
    facts = loader_facts(DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False)), indices=True)
    assert (facts.sampler, facts.distributed, facts.batches_per_epoch, facts.dataset_len) == (
        "DistributedSampler", True, 3, 10,
    )  # fmt: skip
    assert facts.indices == list(range(10))
    plain = loader_facts(DataLoader(data, batch_size=4, shuffle=True), indices=True)
    assert (plain.sampler, plain.distributed) == ("RandomSampler", False)
    assert sorted(plain.indices or []) == list(range(10))
