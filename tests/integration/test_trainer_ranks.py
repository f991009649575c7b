"""The trainer callbacks' ceiling=... on trainings of two processes (CPU, gloo; about 10 s each). Hugging Face under
torchrun: on a stream, which accelerate dispatches from rank 0, both ranks train on repeated batches at the same
steps without asking the dispatcher, a straggler rank included, each measures its ceiling, each rank's real stream
is its stream without the ceiling, and rank 0's report has the job's, as `loaderdoctor run --ceiling` over the
ranks gives them too; on a map-style dataset (each rank its share) ceiling_only ends both ranks at once, with the
job's ceiling. Lightning's DDP fit: rank 0's report has the job's ceiling from both ranks'. A plain loop's watch()
under torchrun: the same, its process group destroyed before the watch ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = [pytest.mark.workers, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).with_name("huggingface_ranks.py")
LIGHTNING_SCRIPT = Path(__file__).with_name("lightning_ranks.py")
WATCH_SCRIPT = Path(__file__).with_name("watch_ranks.py")


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _started(command: list[str]) -> subprocess.CompletedProcess:
    """`command` run to its end in a session of its own: on a timeout the whole tree goes (the launcher's ranks
    too), then the test fails."""
    process = subprocess.Popen(command, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _launch(out: Path, *options: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The two-rank training with `options`; its result and what each rank wrote."""
    out.mkdir()
    result = _started([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       str(SCRIPT), str(out), *options])  # fmt: skip
    written = [
        json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1) if (out / f"rank{rank}.json").exists()
    ]
    return result, written


def _ended_well(result: subprocess.CompletedProcess) -> bool:
    """The launch ended with status 0, or torch's gloo aborted a rank's interpreter as it exited, its work done and
    written (a race in torch's teardown of a process group left to the exit, seen about once in ten launches here;
    destroy_process_group() instead can deadlock in the DDP reducer's teardown)."""
    return result.returncode == 0 or "terminate called without an active exception" in result.stderr


def _real_stream(seen: list[list[int]]) -> list[list[int]]:
    """The 60 batches a rank trained on, less those handed again (each equal to the one before it)."""
    assert len(seen) == 60
    return [batch for n, batch in enumerate(seen) if n == 0 or batch != seen[n - 1]]


def test_a_dispatched_stream_on_two_ranks_switches_together_under_the_callback_and_under_run(tmp_path):
    # Without the ceiling, step k of rank r trains on samples 8k + 4r to 8k + 4r + 3: rank 0 reads the stream in
    # batches of 4 and dispatches two a step, rank 0's first (a plain launch showed it; not repeated, for time).
    plain = [{"seen": [[8 * k + 4 * r + n for n in range(4)] for k in range(60)]} for r in (0, 1)]
    _check_callback(plain, *_launch(tmp_path / "ceiling", "stream", "--ceiling", "9", "--straggler"))
    _check_run(plain, tmp_path / "run")


def _check_callback(plain: list[dict], result: subprocess.CompletedProcess, ranks: list[dict]) -> None:
    """The callback's ceiling: each rank hands its own last batch again at the same steps, none asking the
    dispatcher then, and measures its turns."""
    assert _ended_well(result), result.stderr[-3000:]
    for rank, written in enumerate(ranks):  # 9 data-free steps of the 60 on both ranks, each one's turns measured
        assert written["data_free_steps"] == 9 and written["complete"], written
        assert written["batches"] == [60 - 9]  # the run's batches are the real ones
        assert written["speedup"] > 2  # 8 samples x 4 ms of loading per step against a linear model's step
        assert _real_stream(written["seen"]) == plain[rank]["seen"][: 60 - 9]
    job = ranks[0]["job"]
    assert "job-ceiling" in ranks[0]["rules"] and "job-ceiling" not in ranks[1]["rules"]
    assert job["ranks_measured"] == 2 and set(job["input_cost_by_rank"]) == {"0", "1"}
    assert "job-ceiling" in result.stderr  # rank 0 printed its report


def _check_run(plain: list[dict], out: Path) -> None:
    """`run --ceiling` over the ranks, without the callback: accelerate's dispatcher is what each rank's loop
    iterates (rank 0 alone iterates the DataLoader), so each rank's watch hands its own last batch again at the
    same steps, no rank entering the dispatcher's broadcast then."""
    out.mkdir()
    result = _started([sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--ceiling", "9", "--json",
                       str(out / "out.json"), "--nproc-per-node", "2", str(SCRIPT), str(out), "stream"])  # fmt: skip

    assert _ended_well(result), result.stderr[-3000:]
    loaders = json.loads((out / "out.json").read_text())["loaders"]
    names = sorted(loaders)
    assert [name[-6:] for name in names] == ["/rank0", "/rank1"], names
    for name in names:
        measured = loaders[name]["measurements"]
        assert measured["batches"] == 60 - 9, name  # the dispatcher's batches, one per step, on either rank
        assert measured["ceiling"]["data_free_steps"] == 9 and measured["ceiling"]["complete"], name
    assert "job-ceiling" in [finding["rule"] for finding in loaders[names[0]]["findings"]]
    for rank in (0, 1):  # each rank's real stream is its stream without the ceiling
        seen = json.loads((out / f"rank{rank}.json").read_text())["seen"]
        assert _real_stream(seen) == plain[rank]["seen"][: 60 - 9]


def test_ceiling_only_ends_both_ranks_of_a_map_style_training_at_the_same_step(tmp_path):
    result, ranks = _launch(tmp_path / "only", "indexed", "--ceiling", "9", "--only")

    assert _ended_well(result), result.stderr[-3000:]
    assert len(ranks) == 2 and [rank["ended"] for rank in ranks] == [0, 0]
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) < 60  # ended once measured, at the same step
    for rank in ranks:
        assert rank["data_free_steps"] == 9 and rank["complete"], rank
    assert ranks[0]["job"]["ranks_measured"] == 2
    assert result.stderr.count("ranks (Hugging Face Trainer)") == 1  # rank 0 alone printed


def test_a_lightning_ddp_fit_gives_each_ranks_ceiling_and_the_jobs_on_rank_0(tmp_path, only=False):
    # (ceiling_only, lightning_ranks.py --only, ends both ranks at the same step with the job's: checked by hand,
    # 10 s more of the suite's time)
    pytest.importorskip("lightning")
    result = _started([sys.executable, str(LIGHTNING_SCRIPT), str(tmp_path), *(["--only"] if only else [])])

    assert _ended_well(result), result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["data_free_steps"] == 9 and rank["complete"], rank
        assert rank["ended"] == (0 if only else None)
    assert ranks[0]["batches"] == ranks[1]["batches"] == (50 if not only else ranks[0]["batches"])
    assert only == (ranks[0]["batches"] < 50)  # ceiling_only ended both ranks at the same step, before the end
    assert "job-ceiling" in ranks[0]["rules"] and "job-ceiling" not in ranks[1]["rules"]
    assert ranks[0]["job"]["ranks_measured"] == 2 and set(ranks[0]["job"]["input_cost_by_rank"]) == {"0", "1"}


def test_a_watched_loop_on_two_ranks_gives_the_jobs_ceiling_on_rank_0_after_its_process_group_is_gone(tmp_path):
    result = _started([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       str(WATCH_SCRIPT), str(tmp_path)])  # fmt: skip

    assert _ended_well(result), result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, written in enumerate(ranks):  # each rank's turns measured at the same steps (rank 1 the straggler)
        assert written["data_free_steps"] == 9 and written["complete"], written
        real = [batch for n, batch in enumerate(written["seen"]) if n == 0 or batch != written["seen"][n - 1]]
        assert real == [[8 * k + 2 * n + rank for n in range(4)] for k in range(50)], rank  # DistributedSampler's
    assert "job-ceiling" in ranks[0]["rules"] and "job-ceiling" not in ranks[1]["rules"]
    assert ranks[0]["job"]["ranks_measured"] == 2 and set(ranks[0]["job"]["input_cost_by_rank"]) == {"0", "1"}
    assert "no ceiling from rank" not in result.stderr
