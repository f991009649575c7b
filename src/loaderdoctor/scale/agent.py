"""The launcher agent of one node for one launch: `python -m loaderdoctor.scale.agent ORDER.json` starts the ranks
through torch.distributed's elastic launch API (the machinery behind torchrun) and writes what they returned,
or how they failed, as a LaunchResult next to the order. launch.py runs it in a session of its own, so that a
launch that outlives its budget ends with every process it started."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from loaderdoctor.scale.order import Topology, static_launch_config
from loaderdoctor.scale.rank import run_rank
from loaderdoctor.scale.results import LaunchResult, RankFailure, RankResult, written_results

# How long the ranks of every node may take to meet (a node started later joins within this).
RENDEZVOUS_TIMEOUT_S = 120
# After a rank fails, how long the others get to end on SIGTERM before SIGKILL.
SHUTDOWN_TIMEOUT_S = 5
_MESSAGE_CHARS = 600


def _launch_config(order: dict[str, Any]) -> LaunchConfig:
    """The launcher's settings for an order: the ranks' output kept in files of the order's log_dir."""
    return static_launch_config(
        Topology(**order["topology"]),
        endpoint=order["endpoint"],
        run_id=order["run_id"],
        log_dir=order["log_dir"],
        rendezvous_timeout_s=RENDEZVOUS_TIMEOUT_S,
        shutdown_timeout_s=SHUTDOWN_TIMEOUT_S,
        keep_output=True,
    )


def run(order: dict[str, Any]) -> LaunchResult:
    topology = order["topology"]
    launch = LaunchResult(world_size=topology["ranks"] * topology["nnodes"], ranks_per_node=topology["ranks"])
    if topology["ranks"] > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it for more than one rank per node
    started = time.monotonic()
    try:
        returned = elastic_launch(_launch_config(order), run_rank)(order["launch_order"])
    except ChildFailedError as error:
        launch.failures = [
            _failure(rank, failure, order["log_dir"]) for rank, failure in sorted(error.failures.items())
        ]
        launch.results = written_results(order["ranks_dir"])
    else:
        launch.results = _joined(returned)
    launch.wall_s = time.monotonic() - started
    return launch


def _joined(returned: dict[int, Any]) -> list[RankResult]:
    """Every rank's result once: the ranks gathered theirs, so any one list may hold them all."""
    by_rank: dict[int, dict[str, Any]] = {}
    for value in returned.values():
        for result in (value or {}).get("results", []):
            by_rank.setdefault(result["rank"], result)
    return [RankResult.from_dict(by_rank[rank]) for rank in sorted(by_rank)]


def _failure(rank: int, failure: Any, log_dir: str) -> RankFailure:
    """A failed rank as the launcher saw it, with the end of what it wrote to stderr when torch has no message."""
    signal_name = failure.signal_name() if failure.exitcode < 0 else None
    message = failure.message
    if isinstance(message, dict):  # torch's error file: {"message": the error, "extraInfo": its traceback...}
        message = str(message.get("message", ""))
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    message = lines[-1] if lines else ""  # a traceback's last line: the error itself
    if message.startswith(("To enable traceback", "Signal ")):
        message = ""  # torch's placeholder, or the signal said again
    if not message and not signal_name:
        message = _stderr_tail(log_dir, failure.local_rank)
    return RankFailure(rank, failure.exitcode, signal_name, message[-_MESSAGE_CHARS:].strip())


def _stderr_tail(log_dir: str, local_rank: int) -> str:
    for path in Path(log_dir).glob(f"*/attempt_*/{local_rank}/stderr.log"):
        try:
            return path.read_text(errors="replace")[-_MESSAGE_CHARS:]
        except OSError:
            continue
    return ""


def main(argv: list[str]) -> int:
    order_path = Path(argv[0])
    order = json.loads(order_path.read_text())
    # The launcher's own logging (its settings, every rendezvous) is noise here: its errors come back as data.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.launcher").setLevel(logging.ERROR)
    launch = run(order)
    tmp = order_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(launch.to_dict()))
    tmp.replace(order["result_path"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
