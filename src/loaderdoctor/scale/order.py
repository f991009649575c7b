"""What one launch of ranks is asked to do (LaunchOrder, handed to every rank as JSON) and where it runs (Topology)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from loaderdoctor.errors import UsageError


@dataclass(frozen=True)
class LaunchOrder:
    """What every rank of one launch does: measure the loaders of `target` for `budget_s` seconds in all (shared
    by the loaders), the ranks stepping together; with `lock_free`, lock calls on files opened read-only are
    no-ops in the workers."""

    target: str
    budget_s: float
    out_dir: str  # each rank writes rank-N.json here too, so that what a rank measured outlives a failed launch
    step_ms: float | None = None
    lock_free: bool = False
    # How long a collective may wait for a rank: longer than a stall takes to be noticed, so that a rank whose
    # loader hangs is named by its own watchdog before the others give up on it.
    collective_timeout_s: float = 120.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LaunchOrder:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Topology:
    """Where the ranks run: `ranks` per node on `nnodes` machines; this machine is node `node_rank`. Every
    node's agent meets the others at `rdzv_endpoint` (HOST:PORT on node 0; the i-th launch of a scale run uses
    PORT + i)."""

    ranks: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # None: one node, a free port on 127.0.0.1

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise UsageError(f"a launch needs 1 rank or more per node, not {self.ranks}")
        if self.nnodes < 1:
            raise UsageError(f"--nnodes must be 1 or more, not {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(
                f"--node-rank must be from 0 to {self.nnodes - 1} with --nnodes {self.nnodes}, not {self.node_rank}"
            )
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageError(
                "a run across machines needs --rdzv-endpoint HOST:PORT",
                hint="give every node the same address of node 0, e.g. --rdzv-endpoint 10.0.0.1:29500",
            )
        if self.rdzv_endpoint is not None:
            endpoint_parts(self.rdzv_endpoint)

    @property
    def world_size(self) -> int:
        return self.ranks * self.nnodes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def endpoint_parts(endpoint: str) -> tuple[str, int]:
    """HOST and PORT of "HOST:PORT", or a UsageError that says what is wrong."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--rdzv-endpoint must be HOST:PORT, not {endpoint!r}", hint="e.g. --rdzv-endpoint 127.0.0.1:29500"
        )
    return host.strip("[]"), int(port)


def static_launch_config(
    topology: Topology,
    *,
    endpoint: str,
    run_id: str,
    log_dir: str,
    rendezvous_timeout_s: float,
    shutdown_timeout_s: float,
    keep_output: bool,
) -> Any:
    """torch's elastic launcher's LaunchConfig for `topology`: a static rendezvous at `endpoint` (node 0 hosts
    it), no restarts (a failed rank is a finding, not something to retry), the ranks started with spawn; with
    `keep_output` their stdout and stderr go to files under `log_dir`, else where the launcher's own go."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=topology.nnodes,
        max_nodes=topology.nnodes,
        nproc_per_node=topology.ranks,
        run_id=run_id,
        rdzv_backend="static",
        rdzv_endpoint=endpoint,
        rdzv_configs={"rank": topology.node_rank, "timeout": rendezvous_timeout_s},
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL if keep_output else Std.NONE),
        shutdown_timeout=shutdown_timeout_s,
    )
