"""A script run as N ranks, as torchrun runs it: torch.distributed's elastic launcher starts `python -m
loaderdoctor.watch.ranks SCRIPT ARGS` in each rank (the script's output goes where torchrun's would); each
rank runs the script with its loaders watched and writes what it measured to a file of its own; this node's
ranks' loaders are then joined here, and rank-straggler judged across the ranks of each loader."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from loaderdoctor.recording import Recording
from loaderdoctor.rules import order
from loaderdoctor.rules.straggler import rank_straggler
from loaderdoctor.scale.job import Topology, endpoint_parts, static_launch_config
from loaderdoctor.scale.launch import free_port
from loaderdoctor.scale.plan import DdpPlan, ddp_plan
from loaderdoctor.watch.everyloader import EveryLoader, LoaderRun
from loaderdoctor.watch.script import Script, ScriptRun, run_script

# What the ranks read from their environment: where to write, and whether to guard.
RUN_DIR_ENV = "LOADERDOCTOR_RUN_DIR"
GUARD_ENV = "LOADERDOCTOR_RUN_GUARD"
NAME_ENV = "LOADERDOCTOR_RUN_NAME"
# After a rank fails, how long the others get to end on SIGTERM (and write what they measured) before SIGKILL.
SHUTDOWN_TIMEOUT_S = 30
RENDEZVOUS_TIMEOUT_S = 900


def run_ranks(script: Script, topology: Topology, *, guarded: bool, name: str | None = None) -> ScriptRun:
    """Run `script` in `topology.ranks` ranks on this node; its exit status (the rank that failed first's, else 0) and
    the loaders of this node's ranks, with rank-straggler added to the straggling rank's loader."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    work = Path(tempfile.mkdtemp(prefix="loaderdoctor-run-"))
    if topology.rdzv_endpoint is None:
        endpoint = f"127.0.0.1:{free_port()}"
    else:
        host, port = endpoint_parts(topology.rdzv_endpoint)
        endpoint = f"{host}:{port}"
    config = static_launch_config(
        topology,
        endpoint=endpoint,
        run_id="loaderdoctor-run",
        log_dir=str(work / "logs"),
        rendezvous_timeout_s=RENDEZVOUS_TIMEOUT_S,
        shutdown_timeout_s=SHUTDOWN_TIMEOUT_S,
        keep_output=False,  # the script's output goes where torchrun's would
    )
    environ = {RUN_DIR_ENV: str(work), GUARD_ENV: "1" if guarded else "", NAME_ENV: name or ""}
    if topology.ranks > 1:
        environ.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # as torchrun sets it
    saved = {variable: os.environ.get(variable) for variable in environ}
    os.environ.update(environ)
    quiet = [logging.getLogger(logger) for logger in ("torch.distributed.elastic", "torch.distributed.launcher")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)  # the launcher's own chatter; a rank's failure comes back as its status
    status, ended_by = 0, None
    try:
        elastic_launch(config, sys.executable)("-m", "loaderdoctor.watch.ranks", *script.argv())
    except ChildFailedError as error:
        failed_rank, first = _first_failure(error.failures)
        status = first.exitcode if first.exitcode >= 0 else 128 - first.exitcode
        ended_by = f"rank {failed_rank} failing"
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value
        loaders, hosts = _written(work)
        shutil.rmtree(work, ignore_errors=True)
    return ScriptRun(status, joined(loaders, hosts, topology.world_size), ended_by)


def _first_failure(failures: dict[int, Any]) -> tuple[int, Any]:
    """The rank that failed first, and its failure: the launcher ends the others with SIGTERM when one fails,
    and its timestamps are whole seconds, so a rank ended by SIGTERM comes after one that failed otherwise."""
    ended = (-signal.SIGTERM, 128 + signal.SIGTERM)
    return min(failures.items(), key=lambda item: (item[1].timestamp, item[1].exitcode in ended, item[0]))


def _written(work: Path) -> tuple[dict[int, list[LoaderRun]], dict[int, str]]:
    """What each rank wrote (its loaders), and each rank's host."""
    loaders: dict[int, list[LoaderRun]] = {}
    hosts: dict[int, str] = {}
    for path in work.glob("rank*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            data = json.loads(path.read_text())
            rank = int(data["rank"])
            loaders[rank] = [LoaderRun.from_dict(item) for item in data["loaders"]]
            hosts[rank] = str(data["host"])
    return loaders, hosts


def joined(loaders: dict[int, list[LoaderRun]], hosts: dict[int, str], world_size: int) -> list[LoaderRun]:
    """Each rank's loaders, in rank order, with, for each loader made at one place in every rank
    ("train.py:41/rank0", "train.py:41/rank1"...), rank-straggler added to the straggling rank's loader when there
    is one, and the DDP plan on the lowest rank's loader when it draws from a DistributedSampler."""
    by_site: dict[str, dict[int, LoaderRun]] = {}
    for rank, runs in sorted(loaders.items()):
        for run in runs:
            by_site.setdefault(run.report.name.removesuffix(f"/rank{rank}"), {})[rank] = run
    for ranks in by_site.values():
        finding = rank_straggler(
            {rank: run.report.recording for rank, run in ranks.items()},
            hosts,
            {rank: run.report.findings for rank, run in ranks.items()},
        )
        if finding is not None:
            slow = ranks[int(finding.evidence["rank"])].report
            slow.findings = order([*slow.findings, finding])
        first = ranks[min(ranks)].report
        first.plan = _plan(first.recording, world_size)
    return [run for _, runs in sorted(loaders.items()) for run in runs]


def _plan(rec: Recording, world_size: int) -> DdpPlan | None:
    """The DDP plan of a rank's loader, from its dataset, batch size and drop_lasts; None without a
    DistributedSampler (each rank then reads the whole dataset: no plan describes that) or a known size."""
    if rec.sampler_drop_last is None or not rec.dataset_len or not rec.batch_size:
        return None
    return ddp_plan(rec.dataset_len, rec.batch_size, world_size, drop_last=bool(rec.drop_last),
                    sampler_drop_last=rec.sampler_drop_last)  # fmt: skip


def _rank_main(argv: list[str]) -> int:
    """One rank: the script run with its loaders watched, what they measured written for the launching node."""
    module = bool(argv) and argv[0] == "-m"
    rest = argv[1:] if module else argv
    script = Script(rest[0], tuple(rest[1:]), module=module)
    rank = int(os.environ["RANK"])  # the launcher's; run_ranks launches only for a world of 2 ranks or more
    every = EveryLoader(name=os.environ.get(NAME_ENV) or None, rank=rank, guarded=bool(os.environ.get(GUARD_ENV)))
    run = run_script(script, every)
    out = Path(os.environ[RUN_DIR_ENV]) / f"rank{rank}.json"
    written: dict[str, Any] = {
        "rank": rank,
        "host": socket.gethostname(),
        "loaders": [r.to_dict() for r in run.loaders],
    }
    try:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(written))
        tmp.replace(out)
    except (OSError, ValueError) as error:
        print(f"loaderdoctor run: rank {written['rank']} could not write what it measured: {error}", file=sys.stderr)
    return run.exit_status


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))
