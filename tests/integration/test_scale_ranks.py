"""scale end to end: real ranks through torch.distributed's elastic launcher (gloo on this CPU machine), each
launch bounded; nothing of a launch may outlive it, whether its ranks finish, hang or are killed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from checkout import checkout_env

import loaderdoctor
from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.scale.launch import free_port, launch
from loaderdoctor.scale.order import LaunchOrder, Topology
from loaderdoctor.scenarios import lock_contention

pytestmark = [pytest.mark.workers, pytest.mark.timeout(300)]

TARGETS = Path(__file__).with_name("scale_targets.py")


def _leftover_ranks() -> list[str]:
    """Processes of a loaderdoctor launch still alive anywhere on the machine (they carry its run id)."""
    left = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            run_id = process.environ().get("TORCHELASTIC_RUN_ID", "")
        except (psutil.Error, OSError):
            continue
        if run_id.startswith("loaderdoctor-scale") and process.status() != psutil.STATUS_ZOMBIE:
            left.append(f"pid {process.pid}: {' '.join(process.info['cmdline'] or [])[:100]}")
    return left


@pytest.fixture(autouse=True)
def no_rank_left_behind():
    yield
    deadline = time.monotonic() + 5
    while _leftover_ranks() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftover_ranks() == []


def test_a_loader_without_distributed_sampler_is_named_under_two_ranks():
    report = loaderdoctor.scale("scenario:no-distributed-sampler", ranks=[2], budget_s=3)
    (loader,) = report.loaders.values()
    main = loader.findings[0]
    assert main.rule == "distributed-sampler"
    assert main.evidence["shared_samples_share"] == 1.0  # same seed in every rank: the very same samples
    assert main.evidence["samples_per_rank"] == 512
    assert report.exit_status == 1
    (run,) = loader.runs
    assert run.ranks == 2 and [r.rank for r in run.per_rank] == [0, 1]
    assert all(r.batches > 0 for r in run.per_rank)


@pytest.mark.quiet
def test_a_healthy_ddp_loader_scales_with_no_warning():
    # One light worker per rank: on this 2-core machine the ranks' loading leaves the cores free, as a healthy
    # loader on a machine with cores for its ranks does.
    report = loaderdoctor.scale(f"{TARGETS}:light_ddp", ranks=[1, 2], step_ms=50, budget_s=3)
    (loader,) = report.loaders.values()
    serious = [(f.rule, f.title) for f in loader.findings if f.severity != "info"]
    assert serious == []
    one, two = loader.runs
    assert (one.ranks, two.ranks) == (1, 2)
    assert one.efficiency == 1.0
    assert two.efficiency is not None and two.efficiency >= 0.8, loader.runs
    # The ranks step together: each rank delivered about as many batches as the other.
    batches = [r.batches for r in two.per_rank]
    assert max(batches) - min(batches) <= 1
    assert loader.plan is not None and loader.plan.world_size == 2 and loader.plan.batches_per_rank == 16
    assert report.exit_status == 0


@pytest.mark.quiet
def test_a_lock_the_workers_of_every_rank_wait_on_is_named_and_proved_by_a_lock_free_launch():
    report = loaderdoctor.scale("scenario:lock-contention", ranks=[1, 2], budget_s=2)
    (loader,) = report.loaders.values()
    one, two = loader.runs
    assert not one.failed and not two.failed, (one.failures, two.failures)
    assert two.efficiency is not None and two.efficiency < 0.7, loader.runs  # one lock serialises both ranks
    main = loader.findings[0]
    assert main.rule == "lock-contention", [f.rule for f in loader.findings]
    assert main.evidence["lock"] == "fcntl.flock"
    source = Path(lock_contention.__file__).read_text().splitlines()
    line = next(n for n, text in enumerate(source, 1) if "fcntl.flock(poses, fcntl.LOCK_EX)" in text)
    assert main.evidence["site"].endswith(f"lock_contention.py:{line} in __getitem__")
    assert main.evidence["waiting_share_at_2_ranks"] >= main.evidence["waiting_share_at_1_ranks"] > 0.3
    assert main.evidence["efficiency"] == two.efficiency
    proof = loader.verification
    assert proof is not None and proof.source == "lock-free"
    assert proof.speedup is not None and proof.speedup >= 1.5, proof.note
    assert proof.note.startswith("without the lock on read-only files:")


@pytest.mark.quiet
def test_the_rank_that_loads_from_slow_storage_is_named_a_straggler():
    report = loaderdoctor.scale(f"{TARGETS}:slow_storage_on_rank_1", ranks=[2], budget_s=3)
    (loader,) = report.loaders.values()
    straggler = next((f for f in loader.findings if f.rule == "rank-straggler"), None)
    assert straggler is not None, [(f.rule, f.title) for f in loader.findings]
    assert straggler.evidence["rank"] == 1 and straggler.evidence["wait_ms"] >= 60
    assert straggler.evidence["others_median_wait_ms"] < straggler.evidence["wait_ms"] / 3
    assert straggler.title.startswith("rank 1 on ") and "the other ranks wait for it" in straggler.title
    assert straggler.evidence["ranks"] == [1] and 0 < straggler.evidence["share_of_others_step"] <= 1


def test_ranks_that_take_different_numbers_of_steps_are_named():
    report = loaderdoctor.scale(f"{TARGETS}:uneven_steps", ranks=[2], budget_s=3)
    (loader,) = report.loaders.values()
    main = loader.findings[0]
    assert main.rule == "distributed-sampler"
    assert main.evidence["batches_per_epoch"] == {"0": 10, "1": 9}


def test_a_rank_that_hangs_is_named_and_the_run_ends():
    started = time.monotonic()
    report = loaderdoctor.scale(f"{TARGETS}:hangs_on_rank_1", ranks=[2], budget_s=20)
    assert time.monotonic() - started < 120
    (loader,) = report.loaders.values()
    (run,) = loader.runs
    assert run.failed
    assert any("rank 1's loader stalled" in failure and "scale_targets.py" in failure for failure in run.failures)
    assert run.per_rank[0].outcome == "completed" and run.per_rank[1].outcome == "stalled"
    assert report.exit_status == 1


def test_a_rank_that_is_killed_is_named_and_the_run_ends():
    started = time.monotonic()
    report = loaderdoctor.scale(f"{TARGETS}:killed_on_rank_1", ranks=[2], budget_s=20)
    assert time.monotonic() - started < 90
    (loader,) = report.loaders.values()
    (run,) = loader.runs
    assert any("rank 1 was killed by SIGKILL" in failure for failure in run.failures), run.failures
    assert run.samples_per_s is None  # no aggregate from half a run
    assert report.exit_status == 1


def test_a_ranks_workers_start_as_in_a_rank_of_torchrun():
    # torchrun starts each rank as a fresh interpreter: its loaders' workers get the platform's start method,
    # not the spawn the launcher used to start the rank.
    fresh = subprocess.run(
        [sys.executable, "-c", "import multiprocessing; print(multiprocessing.get_start_method())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    launched = launch(LaunchOrder(f"{TARGETS}:light_ddp", 0.5, "", step_ms=5), Topology(1))
    (result,) = launched.results
    assert result.loaders["train"].recording.start_method == fresh


def test_a_target_whose_function_raises_in_every_rank_says_so():
    with pytest.raises(LoaderDoctorError, match=r"raises\(\) in .*scale_targets.py raised RuntimeError: no data here"):
        loaderdoctor.scale(f"{TARGETS}:raises", ranks=[1], budget_s=1)


def test_two_launcher_agents_on_this_machine_form_one_job_of_two_nodes(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    env = checkout_env()

    def node(rank: int) -> subprocess.Popen[str]:
        command = [
            sys.executable, "-m", "loaderdoctor", "scale", "scenario:healthy", "--ranks", "1", "--budget", "3",
            "--step-ms", "20", "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint, "--json",
        ]  # fmt: skip
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    nodes = [node(0), node(1)]
    try:
        outputs = [n.communicate(timeout=240) for n in nodes]
    finally:
        for n in nodes:
            n.kill()
            n.wait()
    for (stdout, stderr), n in zip(outputs, nodes, strict=True):
        assert n.returncode == 0, stderr
        document = json.loads(stdout)
        assert document["schema"] == "loaderdoctor.scale/1" and document["nnodes"] == 2
        (run,) = document["loaders"]["train"]["runs"]
        assert run["ranks"] == 2
        assert [r["rank"] for r in run["per_rank"]] == [0, 1]
        assert all(r["batches"] > 0 and r["samples_per_s"] for r in run["per_rank"])
