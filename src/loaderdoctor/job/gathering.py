"""What every rank of a `run` job measured, gathered on node 0 through the job's store (job/meeting.py): each rank
puts its loaders under its own key as it ends (job/onerank.py), each node's launcher says how its ranks ended
under its own key once they have, and node 0 waits for every node's word (a node whose heartbeat stops is lost, not
waited for), then reads every rank's."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from loaderdoctor.job.loaders import LoaderRun
from loaderdoctor.job.meeting import KEY_PREFIX, Heartbeat, Meeting, ended_key

MAX_RANK_BYTES = 256 << 20  # what one rank sent, read from the store: refused above this
TELL_WAIT_AFTER_S = 3.0  # node 0 says it waits for the other nodes once it has for this long
SAY_EVERY_S = 10.0


def rank_key(rank: int) -> str:
    return f"{KEY_PREFIX}rank/{rank}"


def so_far_key(rank: int) -> str:
    """Where a rank puts what it measured so far, as its epochs end (job/onerank.py)."""
    return f"{KEY_PREFIX}so-far/{rank}"


def runs_text(runs: list[LoaderRun], **fields: Any) -> str:
    """What a process measured (its loaders), with `fields` (its rank, its host...), as one JSON text."""
    return json.dumps({**fields, "loaders": [run.to_dict() for run in runs]})


def runs_from_text(text: str | bytes) -> tuple[dict[str, Any], list[LoaderRun]]:
    """The fields and the loaders of runs_text() (ValueError, KeyError or TypeError when they cannot be read)."""
    data = json.loads(text)
    return data, [LoaderRun.from_dict(item) for item in data.pop("loaders")]


def read_sent(store: Any, key: str) -> tuple[dict[str, Any], list[LoaderRun]] | None:
    """What a process sent under `key` in the job's store (runs_text's fields and loaders), None when nothing is
    there yet; ValueError for a text over MAX_RANK_BYTES or damaged, and the store's own errors."""
    if not store.check([key]):
        return None
    raw = store.get(key)
    if len(raw) > MAX_RANK_BYTES:
        raise ValueError(f"{len(raw)} bytes, more than {MAX_RANK_BYTES}")
    return runs_from_text(raw)


@dataclass
class NodeEnd:
    """How one node's ranks ended, as its launcher said (or as node 0 found: `lost_after_s` when its heartbeat
    stopped, `host` as it said when the nodes met)."""

    node: int
    host: str = ""
    exit_status: int = 0
    ended_by: str | None = None
    rank_ends: dict[str, str] = field(default_factory=dict)  # rank -> "killed by SIGKILL", "exit status 1"
    lost_after_s: float | None = None  # the node's heartbeat stopped: it said nothing, after this long

    def words(self) -> str:
        where = f"node {self.node}" + (f" ({self.host})" if self.host else "")
        if self.lost_after_s is not None:
            return f"{where} was lost: its heartbeat stopped and nothing came from it for {self.lost_after_s:.0f} s"
        ends = "; ".join(f"rank {rank} {how}" for rank, how in sorted(self.rank_ends.items(), key=_by_rank))
        said = f"{where} ended with exit status {self.exit_status}"
        said += f", by {self.ended_by}" if self.ended_by else ""
        return said + (f" ({ends})" if ends else "")


def _by_rank(item: tuple[str, str]) -> int:
    return int(item[0]) if item[0].isdigit() else 0


def tell_end(meeting: Meeting, end: NodeEnd) -> None:
    """This node's end, said to node 0 (nothing when its store is gone: node 0 then has lost this node anyway)."""
    with contextlib.suppress(Exception):  # the store's errors: node 0 gone
        meeting.store.set(ended_key(meeting.node_rank), json.dumps(asdict(end)))


def gather(
    meeting: Meeting,
    heartbeat: Heartbeat,
    world_size: int,
    *,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> Gathered:
    """On node 0, once its own ranks have ended: every other node's end (waited for while its heartbeat goes on; a
    Ctrl-C ends the wait), then what each rank sent (at its end, else as its epochs ended)."""
    ends: dict[int, NodeEnd] = {}
    started = told_at = clock()
    waiting = set(range(1, meeting.nnodes))
    with contextlib.suppress(KeyboardInterrupt):
        while waiting:
            for node in sorted(waiting):
                if meeting.store.check([ended_key(node)]):
                    ends[node] = _node_end(meeting.store.get(ended_key(node)), node, meeting.host(node))
                    waiting.discard(node)
                elif (stopped := heartbeat.stopped_for(node)) is not None:
                    ends[node] = NodeEnd(node, meeting.host(node), 1, lost_after_s=stopped)
                    waiting.discard(node)
            if not waiting:
                break
            now = clock()
            if now - started >= TELL_WAIT_AFTER_S and (told_at == started or now - told_at >= SAY_EVERY_S):
                told_at = now
                names = ", ".join(f"node {n} ({meeting.host(n)})" for n in sorted(waiting))
                say(f"waiting for {names} to end its ranks, {now - started:.0f} s")
            time.sleep(0.1)
    gathered = Gathered(node_ends=[ends[node] for node in sorted(ends)])
    for rank in range(world_size):
        for key in (rank_key(rank), so_far_key(rank)):  # what it sent at its end, else what it sent before
            try:
                sent = read_sent(meeting.store, key)
            except Exception as error:  # a damaged or oversized text, or the store's errors
                gathered.problems.append(f"what rank {rank} sent could not be read ({type(error).__name__}: {error})")
                continue
            if sent is None:
                continue
            fields, runs = sent
            gathered.loaders[rank], gathered.hosts[rank] = runs, str(fields.get("host", ""))
            if fields.get("so_far"):
                gathered.so_far[rank] = max((run.report.recording.wall_s for run in runs), default=0.0)
            break
    return gathered


@dataclass
class Gathered:
    """What node 0 gathered: the loaders by rank, each rank's host, the ranks whose loaders are what they sent as
    their epochs ended (they sent nothing at their end) with how far into their run that was, the other nodes'
    ends, and the problems met reading what the ranks sent."""

    loaders: dict[int, list[LoaderRun]] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)
    so_far: dict[int, float] = field(default_factory=dict)
    node_ends: list[NodeEnd] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _node_end(raw: bytes, node: int, host: str) -> NodeEnd:
    try:
        data = json.loads(raw)
        return NodeEnd(
            node,
            str(data.get("host") or host),
            int(data.get("exit_status", 0)),
            None if data.get("ended_by") is None else str(data["ended_by"]),
            {str(rank): str(how) for rank, how in dict(data.get("rank_ends") or {}).items()},
        )
    except (ValueError, TypeError, AttributeError):
        return NodeEnd(node, host, 1, "an end it could not say (its word was damaged)")
