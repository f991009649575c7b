"""Launch the ranks of one scale measurement: the node's launcher agent (agent.py) runs as a child process in a
session of its own, bounded by a time limit; whatever happens, every process of that session has ended when
launch() returns."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from loaderdoctor.errors import UsageError
from loaderdoctor.host.tempfolders import make_private_folder, remove_folder
from loaderdoctor.plain.words import plural
from loaderdoctor.scale.order import LaunchOrder, Topology, endpoint_parts
from loaderdoctor.scale.results import LaunchResult, written_results

# On top of the measuring: the ranks' start (interpreters, imports, rendezvous) and a stall's detection.
STARTUP_ALLOWANCE_S = 120.0
# After SIGTERM, how long the agent gets to end its ranks before every process of the launch is killed.
TERM_GRACE_S = 10.0
_LOG_TAIL_CHARS = 1500
# The most ranks per node a launch starts (see rank_bound): $LOADERDOCTOR_MAX_RANKS, else per usable core, at least.
MAX_RANKS_ENV = "LOADERDOCTOR_MAX_RANKS"
RANKS_PER_CORE = 2
MIN_RANK_BOUND = 16


def time_limit_s(budget_s: float) -> float:
    """How long a launch measuring for `budget_s` seconds may take in all before it is ended."""
    return 2 * budget_s + STARTUP_ALLOWANCE_S


def launch(
    launch_order: LaunchOrder, topology: Topology, *, index: int = 0, limit_s: float | None = None
) -> LaunchResult:
    """Run `launch_order` in `topology.ranks` ranks on this node (one node of `topology.nnodes`), the `index`-th
    launch of a scale run (each launch meets at its own port: the endpoint's port + index). Returns what the ranks
    sent back; a launch past its time limit is ended, and says so."""
    limit_s = time_limit_s(launch_order.budget_s) if limit_s is None else limit_s
    work = Path(make_private_folder("loaderdoctor-scale-"))
    try:
        ranks_dir = work / "ranks"
        ranks_dir.mkdir()
        order = {
            "launch_order": dataclasses.replace(launch_order, out_dir=str(ranks_dir)).to_json(),
            "ranks_dir": str(ranks_dir),
            "topology": topology.to_dict(),
            "endpoint": _endpoint(topology, index),
            # The same on every node: the nodes of one launch meet under it.
            "run_id": f"loaderdoctor-scale-{index}-{topology.world_size}",
            "log_dir": str(work / "logs"),
            "result_path": str(work / "result.json"),
        }
        order_path = work / "order.json"
        order_path.write_text(json.dumps(order))
        started = time.monotonic()
        ended_by_limit = _run_agent(order_path, work / "agent.log", limit_s)
        return _result(order, work, ended_by_limit, limit_s, time.monotonic() - started)
    finally:
        remove_folder(work)


def _endpoint(topology: Topology, index: int) -> str:
    if topology.rdzv_endpoint is None:
        return f"127.0.0.1:{free_port()}"
    host, port = endpoint_parts(topology.rdzv_endpoint)
    return f"{host}:{port + index}"


def free_port() -> int:
    """A TCP port free on this machine now, for a rendezvous that stays on it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_agent(order_path: Path, log_path: Path, limit_s: float) -> bool:
    """Run the agent to its end, or end it and all its session after `limit_s`; whether the limit ended it."""
    ended_by_limit = False
    agent: subprocess.Popen | None = None
    try:  # from the start: Ctrl-C or SIGTERM (an interrupt too: commands/running.py) may come at any moment
        # The launch's processes make their temporary folders in its own: removed with it, however they end.
        scratch = order_path.parent / "tmp"
        scratch.mkdir(mode=0o700, exist_ok=True)
        with open(log_path, "w") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "loaderdoctor.scale.agent", str(order_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "TMPDIR": str(scratch)},
            )
        agent.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        ended_by_limit = True
        signal_session(agent.pid, signal.SIGTERM)  # the agent ends its ranks, which end their workers
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=TERM_GRACE_S)
    finally:  # also on Ctrl-C and SIGTERM: nothing of the launch outlives it
        if agent is not None:
            signal_session(agent.pid, signal.SIGKILL)
            agent.wait()
            _reap_session(agent.pid)
    return ended_by_limit


def signal_session(session: int, signum: int) -> None:
    """`signum` to the process group `session` (a process started in a session of its own, and what it started
    since), if any of it is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session, signum)


def _reap_session(session: int, wait_s: float = 5.0) -> None:
    """Wait until no process of the session is left (killed ones vanish once their parents reaped them)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(session, 0)
        except (ProcessLookupError, PermissionError):
            return
        signal_session(session, signal.SIGKILL)
        time.sleep(0.05)


def _result(order: dict, work: Path, ended_by_limit: bool, limit_s: float, wall_s: float) -> LaunchResult:
    result_path = Path(order["result_path"])
    topology = order["topology"]
    if result_path.exists():
        launch = LaunchResult.from_dict(json.loads(result_path.read_text()))
    else:
        launch = LaunchResult(world_size=topology["ranks"] * topology["nnodes"], ranks_per_node=topology["ranks"])
        launch.results = written_results(order["ranks_dir"])
        missing = sorted(set(_local_ranks(topology)) - {r.rank for r in launch.results})
        if ended_by_limit:
            launch.note = (
                f"ended after {limit_s:.0f} s, its time limit: "
                + (f"{plural(len(missing), 'rank')} ({', '.join(map(str, missing))}) did not finish" if missing else
                   "the launcher did not end")
            )  # fmt: skip
        else:
            launch.note = "the launcher ended without a result: " + _tail(work / "agent.log")
    launch.wall_s = wall_s
    return launch


def _local_ranks(topology: dict) -> range:
    first = topology["node_rank"] * topology["ranks"]
    return range(first, first + topology["ranks"])


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "(no output)"
    return text[-_LOG_TAIL_CHARS:] or "(no output)"


def rank_bound() -> tuple[int, str]:
    """The most ranks a launch starts on one node of this machine, and why: $LOADERDOCTOR_MAX_RANKS when set,
    else RANKS_PER_CORE per usable core (ranks beyond that only queue for the cores), never fewer than
    MIN_RANK_BOUND (as many GPUs as a node has, and room to try DDP on a small machine)."""
    text = os.environ.get(MAX_RANKS_ENV, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"{MAX_RANKS_ENV} must be a whole number of ranks, 1 or more, not {text!r}")
        return int(text), f"{MAX_RANKS_ENV} is {int(text)}"
    from loaderdoctor.host.facts import usable_cores

    cores = usable_cores()[0]
    bound = max(MIN_RANK_BOUND, int(RANKS_PER_CORE * cores))
    return bound, f"{RANKS_PER_CORE} per usable core, of {cores:g} here, and never fewer than {MIN_RANK_BOUND}"


def check_rank_count(ranks: int, option: str) -> None:
    """A UsageError (exit 2) for `ranks` per node beyond rank_bound(), before any process starts: each rank is a
    Python with torch loaded, with its DataLoader workers, and thousands of them bring a machine to its knees."""
    bound, why = rank_bound()
    if ranks > bound:
        raise UsageError(
            f"{option} {ranks} is more ranks than this machine can run: at most {bound} per node here ({why})",
            hint=f"give fewer ranks per node (or spread them over nodes with --nnodes); to start more anyway, "
            f"set {MAX_RANKS_ENV}=N",
        )
