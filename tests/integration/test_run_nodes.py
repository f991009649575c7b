"""`loaderdoctor run` on two real nodes: two network namespaces joined by a veth pair, each with its own hostname
and address (twonodes.py), gloo over the veth, a plain DDP script. The job is diagnosed once, on node 0; a node that
never joins is said and stoppable; a node that dies or is cut off ends the job in bounded time, saying so."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.twonodes import Node, cut_link, kill_node, left_in, skip_reason, two_nodes

pytestmark = [
    pytest.mark.workers,
    pytest.mark.timeout(240),
    pytest.mark.skipif(skip_reason() is not None, reason=f"two nodes cannot be made here: {skip_reason()}"),
]

PORT = 29520
# A DDP step on a map-style dataset: every sample of node SLOW_NODE takes 12 ms to load (storage that is slower
# there), one worker per rank; the step all-reduces, so every rank waits for the slowest. MARK_FILE is written
# once the first epoch is over; EPOCHS epochs in all.
SAMPLES = """\
import os, time, torch
from torch.utils.data import DataLoader, Dataset

class Samples(Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, index):
        if os.environ.get("SLOW_NODE") == os.environ["GROUP_RANK"]:
            time.sleep(0.012)
        return torch.full((4,), float(index))
"""
SCRIPT = (
    SAMPLES
    + """\
import torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
split = not os.environ.get("NO_SPLIT")
loader = DataLoader(Samples(), batch_size=8, num_workers=1, sampler=DistributedSampler(Samples()) if split else None)
for epoch in range(int(os.environ.get("EPOCHS", "3"))):
    if split:
        loader.sampler.set_epoch(epoch)
    for batch in loader:
        total = batch.sum()
        dist.all_reduce(total)
        time.sleep(0.005)
    if epoch == 0 and os.environ.get("MARK_FILE") and dist.get_rank() == 0:
        open(os.environ["MARK_FILE"], "w").close()
dist.destroy_process_group()
"""
)


def _site(script: str) -> str:
    """The name `run` gives the script's loader: where it is made."""
    return f"train.py:{next(n for n, line in enumerate(script.splitlines(), 1) if 'DataLoader(' in line)}"


SITE = _site(SCRIPT)


def _run(node: Node, rank: int, nodes: tuple[Node, Node], tmp_path: Path, *extra: str, nproc: int = 1,
         env: dict[str, str] | None = None) -> subprocess.Popen:  # fmt: skip
    argv = [sys.executable, "-m", "loaderdoctor", "run", "--nnodes", "2", "--node-rank", str(rank),
            "--nproc-per-node", str(nproc), "--rdzv-endpoint", f"{nodes[0].address}:{PORT}", "--no-history", *extra,
            "train.py"]  # fmt: skip
    return subprocess.Popen(
        node.command(argv), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _recipe_on_both(nodes: tuple[Node, Node], tmp_path: Path, recipe: str, env: dict[str, str],
                    **fill: object) -> list[subprocess.Popen]:  # fmt: skip
    """`recipe` run by sh on each node, as a user types it there: `{node}` and `{address}` (node 0's) filled in,
    with `fill` and `env` (SLURM_NODEID and the like, `{node}` in them filled too), `loaderdoctor` and `torchrun`
    on PATH."""
    bin_dir = Path(sys.executable).parent  # where `loaderdoctor` and `torchrun` are, as on a user's PATH
    processes = []
    for rank, node in enumerate(nodes):
        words = {"node": rank, "address": nodes[0].address, **fill}
        their_env = {key: value.format(**words) for key, value in env.items()}
        their_env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        processes.append(subprocess.Popen(
            node.command(["sh", "-c", recipe.format(**words)]), cwd=tmp_path, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True, env={**os.environ, **their_env},
        ))  # fmt: skip
    return processes


def _ended(process: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    """The process's exit status and stderr, once it ended (its session killed after `timeout_s`: a failure)."""
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        pytest.fail(f"still running after {timeout_s} s:\n{stderr}")
    return process.returncode, stderr


def _left_in(process: subprocess.Popen) -> bool:
    """Whether a process of its session is still alive (after a grace), killed if so."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)  # reaped: a killed process stays a zombie of this one until then
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return True


def _first_epoch_over(mark: Path) -> None:
    """Once the script marked its first epoch over (and every rank sent what it measured then), or a failure."""
    deadline = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mark.exists(), "the job never finished its first epoch"
    time.sleep(1)


def _words(text: str) -> str:
    return " ".join(line for line in text.split() if not line.startswith("[W"))


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_slow_node_is_named_once_on_node_0_with_all_its_ranks(tmp_path, nproc):
    (tmp_path / "train.py").write_text(SCRIPT)
    with two_nodes() as nodes:
        env = {"SLOW_NODE": "1", "EPOCHS": "2"}
        processes = [_run(node, rank, nodes, tmp_path, "--json", f"node{rank}.json", nproc=nproc, env=env)
                     for rank, node in enumerate(nodes)]  # fmt: skip
        (status0, said0), (status1, said1) = (_ended(process, 120) for process in processes)
    assert (status0, status1) == (0, 0), said0 + said1  # the script's own status, on every node
    words0, words1 = _words(said0), _words(said1)
    assert f"the job's diagnosis (every rank) is printed on node 0 ({nodes[0].hostname})" in words1
    assert "rank-straggler" not in said1 and not (tmp_path / "node1.json").exists()
    report = json.loads((tmp_path / "node0.json").read_text())
    assert sorted(report["loaders"]) == [f"{SITE}/rank{rank}" for rank in range(2 * nproc)]  # the whole job
    found = [f for loader in report["loaders"].values() for f in loader["findings"] if f["rule"] == "rank-straggler"]
    assert len(found) == 1, words0
    straggler = found[0]["evidence"]
    slow = list(range(nproc, 2 * nproc))  # node 1's ranks
    assert straggler["rank"] in slow and straggler["host"] == nodes[1].hostname, straggler
    assert sorted(straggler["ranks"]) == slow and straggler["hosts"] == [nodes[1].hostname], straggler
    assert f"node 1 ({nodes[1].hostname}) ended with exit status 0" in words0


def test_a_node_that_never_joins_is_said_and_ends_the_job_after_its_timeout(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    with two_nodes() as nodes:
        started = time.monotonic()
        status, said = _ended(_run(nodes[0], 0, nodes, tmp_path, "--rdzv-timeout", "12"), 60)
        took = time.monotonic() - started
    words = _words(said)
    assert status == 1, said
    assert f"waiting for 1 more node (node 1) at {nodes[0].address}:{PORT}, 5 s" in words, said
    assert f"node 1 did not join the job at {nodes[0].address}:{PORT} within 12 s" in words, said
    assert took < 40, took


@pytest.mark.parametrize(("signum", "group", "rank"), [(signal.SIGTERM, False, 0), (signal.SIGTERM, True, 1),
                                                       (signal.SIGINT, True, 0)])  # fmt: skip
def test_a_signal_ends_the_wait_for_the_other_node_at_once(tmp_path, signum, group, rank):
    (tmp_path / "train.py").write_text(SCRIPT)
    with two_nodes() as nodes:
        process = _run(nodes[rank], rank, nodes, tmp_path)
        time.sleep(6)  # waiting by now (the command imports torch first)
        sent = time.monotonic()
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        status, said = _ended(process, 30)
        took = time.monotonic() - sent
        assert not _left_in(process) and left_in(nodes[rank]) == []
    assert status == 128 + signum, said
    assert took < 5, took
    assert "while the nodes waited for each other; no rank started" in _words(said), said
    assert "Traceback" not in said, said


@pytest.mark.parametrize("how", ["killed", "cut off"])
def test_a_node_that_dies_or_is_cut_off_ends_the_job_in_bounded_time_saying_so(tmp_path, how):
    (tmp_path / "train.py").write_text(SCRIPT)
    mark = tmp_path / "first-epoch-over"
    with two_nodes() as nodes:
        env = {"EPOCHS": "100000", "MARK_FILE": str(mark)}
        processes = [_run(node, rank, nodes, tmp_path, env=env) for rank, node in enumerate(nodes)]
        _first_epoch_over(mark)
        lost_at = time.monotonic()
        if how == "killed":
            kill_node(nodes[1])
        else:
            cut_link(nodes[1])
        status0, said0 = _ended(processes[0], 90)
        took = time.monotonic() - lost_at
        if how == "cut off":
            status1, said1 = _ended(processes[1], 90)
            assert status1 == 1, said1
            assert "node 0" in _words(said1) and "lost" in _words(said1), said1
        for process in processes:
            assert not _left_in(process)
        assert left_in(nodes[0]) == [] and left_in(nodes[1]) == []
    words0 = _words(said0)
    assert status0 == 1, said0
    assert took < 60, took
    assert f"node 1 ({nodes[1].hostname}) was lost" in words0, said0
    assert f"ended by node 1 ({nodes[1].hostname}) being lost" in words0, said0
    # what was measured survives: node 1's rank sent it as its epochs ended (node 0's too, when it was stuck)
    assert f"loader '{SITE}/rank0'" in words0 and f"loader '{SITE}/rank1'" in words0, said0
    assert "rank 1 sent nothing at its end: its diagnosis covers its first" in words0, said0


def test_an_unsplit_dataset_is_named_as_the_same_data_on_every_node(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    with two_nodes() as nodes:
        processes = [_run(node, rank, nodes, tmp_path, "--json", "job.json", env={"NO_SPLIT": "1", "EPOCHS": "1"})
                     for rank, node in enumerate(nodes)]  # fmt: skip
        (status0, said0), (status1, said1) = (_ended(process, 120) for process in processes)
    assert (status0, status1) == (0, 0), said0 + said1
    report = json.loads((tmp_path / "job.json").read_text())
    found = [
        f for loader in report["loaders"].values() for f in loader["findings"] if f["rule"] == "distributed-sampler"
    ]
    assert len(found) == 1 and found[0]["severity"] == "critical", _words(said0)
    assert found[0]["evidence"]["world_size"] == 2 and found[0]["evidence"]["shared_samples_share"] == 1.0, found
    assert "distributed-sampler" not in said1


# The README's Slurm recipes, run on the two nodes with the variables srun gives each task (SLURM_*; MASTER_ADDR as
# the batch script exports it): one `run --nnodes` per node, and one `run` per rank.
SLURM_PER_NODE = ('loaderdoctor run --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --nproc-per-node 1 '
                  '--rdzv-endpoint "$MASTER_ADDR:29500" --no-history --json job.json train.py')  # fmt: skip
SLURM_PER_RANK = "loaderdoctor run --no-history --json job.json train_slurm.py"
# A script as Slurm users write it: its process group from srun's variables.
SLURM_SCRIPT = SCRIPT.replace(
    'dist.init_process_group("gloo")',
    'dist.init_process_group("gloo", init_method=f"tcp://{os.environ[\'MASTER_ADDR\']}:29500", '
    'rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))',
).replace('os.environ["GROUP_RANK"]', 'os.environ["SLURM_NODEID"]')


@pytest.mark.parametrize("recipe", [SLURM_PER_NODE, SLURM_PER_RANK], ids=["per-node", "per-rank"])
def test_the_readmes_slurm_recipes_give_one_diagnosis_of_the_job(tmp_path, recipe):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "train_slurm.py").write_text(SLURM_SCRIPT)
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "{node}", "SLURM_PROCID": "{node}", "SLURM_NTASKS": "2",
           "SLURM_LOCALID": "0", "MASTER_ADDR": "{address}", "SLOW_NODE": "1", "EPOCHS": "2"}  # fmt: skip
    with two_nodes() as nodes:
        processes = _recipe_on_both(nodes, tmp_path, recipe, env)
        (status0, said0), (status1, said1) = (_ended(process, 120) for process in processes)
        assert left_in(nodes[0]) == [] and left_in(nodes[1]) == []
    assert (status0, status1) == (0, 0), said0 + said1
    assert "the job's diagnosis (every rank) is printed on" in _words(said1), said1
    report = json.loads((tmp_path / "job.json").read_text())
    assert len(report["loaders"]) == 2, report["loaders"].keys()
    (straggler,) = [f for lr in report["loaders"].values() for f in lr["findings"] if f["rule"] == "rank-straggler"]
    assert straggler["evidence"]["ranks"] == [1] and straggler["evidence"]["host"] == nodes[1].hostname
    assert _words(said0).index("the job: loader") < _words(said0).index("/rank0'")


# The README's recipe for a launcher typed under `run` on every node: torchrun's own rendezvous (static, from
# --master-addr; or c10d), each node's run watching the ranks its torchrun starts.
TORCHRUN_STATIC = ('loaderdoctor run --no-history --json job{node}.json torchrun --nnodes 2 --node-rank {node} '
                   '--nproc-per-node {nproc} --master-addr {address} --master-port 29530 train.py')  # fmt: skip
TORCHRUN_C10D = ('loaderdoctor run --no-history --json job{node}.json torchrun --nnodes 2 --nproc-per-node {nproc} '
                 '--rdzv-backend c10d --rdzv-endpoint {address}:29531 --rdzv-id job train.py')  # fmt: skip


@pytest.mark.parametrize(("recipe", "nproc"), [(TORCHRUN_STATIC, 1), (TORCHRUN_STATIC, 2), (TORCHRUN_C10D, 1)],
                         ids=["static-1", "static-2", "c10d-1"])  # fmt: skip
def test_run_of_torchrun_on_every_node_gives_one_diagnosis_of_the_job_on_rank_0s_node(tmp_path, recipe, nproc):
    (tmp_path / "train.py").write_text(SCRIPT)
    with two_nodes() as nodes:
        processes = _recipe_on_both(nodes, tmp_path, recipe, {"SLOW_NODE": "1", "EPOCHS": "2"}, nproc=nproc)
        (status0, said0), (status1, said1) = (_ended(process, 150) for process in processes)
        assert left_in(nodes[0]) == [] and left_in(nodes[1]) == []
    assert (status0, status1) == (0, 0), said0 + said1
    words0, words1 = _words(said0), _words(said1)
    assert f"the job's diagnosis (every rank) is printed on rank 0's node ({nodes[0].hostname}); this node's ranks" \
        in words1, said1  # fmt: skip
    assert "rank-straggler" not in said1 and not (tmp_path / "job1.json").exists()
    report = json.loads((tmp_path / "job0.json").read_text())
    assert sorted(report["loaders"]) == [f"{SITE}/rank{rank}" for rank in range(2 * nproc)], words0
    found = [f for loader in report["loaders"].values() for f in loader["findings"] if f["rule"] == "rank-straggler"]
    assert len(found) == 1, words0
    slow = list(range(nproc, 2 * nproc))  # node 1's ranks
    assert sorted(found[0]["evidence"]["ranks"]) == slow and found[0]["evidence"]["hosts"] == [nodes[1].hostname]
    assert words0.index("the job: loader") < words0.index("/rank0'")


def test_run_of_torchrun_on_every_node_keeps_what_a_killed_node_measured_and_ends_in_bounded_time(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    mark = tmp_path / "first-epoch-over"
    with two_nodes() as nodes:
        env = {"EPOCHS": "100000", "MARK_FILE": str(mark)}
        processes = _recipe_on_both(nodes, tmp_path, TORCHRUN_STATIC, env, nproc=1)
        _first_epoch_over(mark)
        lost_at = time.monotonic()
        kill_node(nodes[1])
        status0, said0 = _ended(processes[0], 90)
        took = time.monotonic() - lost_at
        for process in processes:
            assert not _left_in(process)
        assert left_in(nodes[0]) == [] and left_in(nodes[1]) == []
    words0 = _words(said0)
    assert status0 == 1 and took < 30, (took, said0)
    assert f"loader '{SITE}/rank0'" in words0 and f"loader '{SITE}/rank1'" in words0, said0
    assert "rank 1 sent nothing at its end within 5 s: its diagnosis covers its first" in words0, said0


# accelerate's launch across machines (its multi-process launch is torchrun's, static rendezvous at the main
# process's address): a script as accelerate's users write it, whose every step reduces across the processes.
ACCELERATE_SCRIPT = (
    SAMPLES
    + """\
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)  # no GPU here: gloo across the processes
loader = accelerator.prepare(DataLoader(Samples(), batch_size=8, num_workers=1))
for epoch in range(2):
    for batch in loader:
        accelerator.reduce(batch.sum())
        time.sleep(0.005)
accelerator.wait_for_everyone()
"""
)
ACCELERATE_SITE = _site(ACCELERATE_SCRIPT)
ACCELERATE_ACROSS = ('loaderdoctor run --no-history --json job{node}.json accelerate launch --multi_gpu '
                     '--num_machines 2 --machine_rank {node} --num_processes 2 --main_process_ip {address} '
                     '--main_process_port 29532 --mixed_precision no --dynamo_backend no train.py')  # fmt: skip


def test_run_of_accelerate_launch_on_every_node_gives_one_diagnosis_of_the_job(tmp_path):
    pytest.importorskip("accelerate")
    (tmp_path / "train.py").write_text(ACCELERATE_SCRIPT)
    with two_nodes() as nodes:
        processes = _recipe_on_both(nodes, tmp_path, ACCELERATE_ACROSS, {"SLOW_NODE": "1"})
        (status0, said0), (status1, said1) = (_ended(process, 150) for process in processes)
        assert left_in(nodes[0]) == [] and left_in(nodes[1]) == []
    assert (status0, status1) == (0, 0), said0 + said1
    assert f"printed on rank 0's node ({nodes[0].hostname})" in _words(said1), said1
    report = json.loads((tmp_path / "job0.json").read_text())
    assert sorted(report["loaders"]) == [f"{ACCELERATE_SITE}/rank0", f"{ACCELERATE_SITE}/rank1"], _words(said0)
    (straggler,) = [f for lr in report["loaders"].values() for f in lr["findings"] if f["rule"] == "rank-straggler"]
    assert straggler["evidence"]["ranks"] == [1] and straggler["evidence"]["hosts"] == [nodes[1].hostname]
