"""The nodes of a `run --nnodes` job meet before torch's launcher starts their ranks, in the job's own store: node 0
hosts torch's TCPStore at the rendezvous endpoint (multi-tenant, so that torch's static rendezvous then takes that
very server), every node puts its name there and waits for the others in Python, so that the wait is said every
PROGRESS_S ("waiting for 1 more node at HOST:PORT, 12 s"), SIGTERM and Ctrl-C end it at once, and it gives up after
its timeout naming the endpoint and the nodes that did not come. Waiting inside torch's rendezvous instead blocks
in C++, where no signal handler runs.

The store then carries the job: each rank's measurements to node 0 (job/gathering.py), and each node's heartbeat
(a counter it adds to every HEARTBEAT_S; compared on each node with its own clock, never with another machine's),
so that a node that vanishes is noticed within LOST_S."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.plain.background import BackgroundThread
from loaderdoctor.tap.signals import SignalRaises

# Where the ranks find the job's store ("HOST:PORT"); set for the launch by job/ranks.py.
STORE_ENV = "LOADERDOCTOR_RUN_STORE"
KEY_PREFIX = "loaderdoctor/run/"
PROGRESS_S = 5.0  # how often the wait for the other nodes is said
POLL_S = 0.1
CONNECT_S = 1.0  # one attempt to reach node 0's store: a node not up yet refuses, a wrong address times out
OPERATION_S = 30.0  # a read or write of the store (a rank's measurements are at most a few MB)
HEARTBEAT_S = 1.0
LOST_S = 15.0  # a node whose heartbeat has not moved for this long is lost (its machine died, or its link)
DEFAULT_TIMEOUT_S = 600.0  # how long the nodes wait for each other, as torchrun's static rendezvous does


class NodesDidNotMeet(LoaderDoctorError):
    """The nodes did not all come to the job's store in time."""


class MeetingStopped(BaseException):
    """SIGTERM or Ctrl-C while the nodes waited for each other: the job ends at once (128 + the signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def node_key(node: int) -> str:
    return f"{KEY_PREFIX}node/{node}"


def beat_key(node: int) -> str:
    return f"{KEY_PREFIX}alive/{node}"


def ended_key(node: int) -> str:
    """Where node `node`'s launcher says how its ranks ended (job/gathering.py)."""
    return f"{KEY_PREFIX}ended/{node}"


@dataclass
class Meeting:
    """The job's store as every node met in it: `store` (node 0's server, or a client of it), this node's rank,
    and each node's host as it said."""

    store: Any
    endpoint: str
    node_rank: int
    nnodes: int
    hosts: dict[int, str] = field(default_factory=dict)

    def host(self, node: int) -> str:
        return self.hosts.get(node) or f"node {node}"


def meet(
    host: str,
    port: int,
    *,
    node_rank: int,
    nnodes: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> Meeting:
    """Meet the job's other nodes at HOST:PORT (node 0 hosts the store there); the meeting once every node came.
    NodesDidNotMeet after `timeout_s`, MeetingStopped on SIGTERM or Ctrl-C; `say` is told of the wait every
    PROGRESS_S."""
    endpoint = f"{host}:{port}"
    started = clock()
    deadline = started + timeout_s
    told_at = started
    with SignalRaises(signal.SIGTERM, MeetingStopped):
        try:
            store = _hosted(port, endpoint) if node_rank == 0 else None
            while store is None:  # node 0's store, once something answers there
                if _answers(host, port):
                    store = _client(host, port)
                    break
                now = clock()
                if now >= deadline:
                    raise NodesDidNotMeet(
                        f"node 0's store at {endpoint} did not answer within {timeout_s:g} s",
                        hint="start node 0 (--node-rank 0) with the same --nnodes, and check that this node "
                        "reaches that address (its firewall, the port)",
                    )
                if now - told_at >= PROGRESS_S:
                    told_at = now
                    say(f"waiting for node 0 at {endpoint} (nothing answers there yet), {now - started:.0f} s")
                time.sleep(POLL_S)
            store.set(node_key(node_rank), json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
            keys = [node_key(node) for node in range(nnodes)]
            while not store.check(keys):
                now = clock()
                missing = [node for node in range(nnodes) if not store.check([node_key(node)])]
                if now >= deadline:
                    raise NodesDidNotMeet(
                        f"{_nodes(missing)} did not join the job at {endpoint} within {timeout_s:g} s",
                        hint=f"start every node with --nnodes {nnodes}, its own --node-rank and --rdzv-endpoint "
                        f"{endpoint} (a node still queued by the scheduler joins when it starts)",
                    )
                if now - told_at >= PROGRESS_S:
                    told_at = now
                    more = "1 more node" if len(missing) == 1 else f"{len(missing)} more nodes"
                    say(f"waiting for {more} ({_nodes(missing)}) at {endpoint}, {now - started:.0f} s")
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            raise MeetingStopped(signal.SIGINT) from None
    hosts = {}
    for node in range(nnodes):
        with contextlib.suppress(ValueError, TypeError, KeyError):
            hosts[node] = str(json.loads(store.get(node_key(node)))["host"])
    return Meeting(store, endpoint, node_rank, nnodes, hosts)


def _nodes(nodes: list[int]) -> str:
    return ("node " if len(nodes) == 1 else "nodes ") + ", ".join(map(str, nodes))


def _hosted(port: int, endpoint: str) -> Any:
    """Node 0's store, served from this process on `port` of every address, waiting for nobody."""
    from torch.distributed import TCPStore

    try:
        return TCPStore("0.0.0.0", port, None, True, timedelta(seconds=OPERATION_S), wait_for_workers=False,
                        multi_tenant=True)  # fmt: skip
    except Exception as error:  # torch's DistNetworkError (its class differs between versions)
        raise NodesDidNotMeet(
            f"node 0 could not serve the job's store at {endpoint}: {error}",
            hint="another job may hold the port: give --rdzv-endpoint another one",
        ) from None


def _answers(host: str, port: int) -> bool:
    """Whether something listens at HOST:PORT now (a plain connection, closed at once: the store ignores it)."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_S):
            return True
    except OSError:
        return False


def _client(host: str, port: int, timeout_s: float = OPERATION_S) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(host, port, None, False, timedelta(seconds=timeout_s), wait_for_workers=False)


def store_client(endpoint: str, timeout_s: float = OPERATION_S) -> Any:
    """A client of the job's store at `endpoint` ("HOST:PORT", as STORE_ENV carries it)."""
    host, _, port = endpoint.rpartition(":")
    return _client(host, int(port), timeout_s)


class Heartbeat:
    """This node's heartbeat in the job's store, and the other nodes' watched: `lost(node, seconds)` is called
    once, from the heartbeat's judge, when a node's heartbeat has not moved for LOST_S (on node 0, any other
    node's that has not said it ended; elsewhere node 0's, or its store's answer: a store call on a link that is
    down blocks, whatever its timeout, until TCP gives up minutes later, so the calls run in a thread of their own,
    the beater, which the judge never waits for)."""

    def __init__(self, meeting: Meeting, lost: Callable[[int, float], None], *, lost_s: float = LOST_S) -> None:
        self.meeting = meeting
        self.lost_s = lost_s
        self.lost_node: int | None = None
        self._lost = lost
        self._store = store_client(meeting.endpoint, timeout_s=max(1.0, lost_s / 3))
        now = time.monotonic()
        watched = range(1, meeting.nnodes) if meeting.node_rank == 0 else []
        # node -> (its counter, when it last moved here): from now, for a node that never beats at all
        self._seen: dict[int, tuple[int, float]] = {node: (-1, now) for node in watched}
        self._answered_at = now  # when the store last answered a whole round
        self._ended: set[int] = set()  # the nodes that said they ended: their heartbeat stops, as it should
        self._stopping = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="loaderdoctor-heartbeat", daemon=True)
        self._judge = BackgroundThread("loaderdoctor-heartbeat-judge", self._judge_tick, HEARTBEAT_S)

    def __enter__(self) -> Heartbeat:
        self._beater.start()
        self._judge.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()  # the beater ends after its call under way (never waited for: it may be stuck)
        self._judge.stop()

    def stopped_for(self, node: int) -> float | None:
        """How long `node`'s heartbeat has not moved, once that is LOST_S or more; None before."""
        if node == self.meeting.node_rank or node in self._ended:
            return None
        if node == 0:
            moved_at = self._answered_at
        elif (seen := self._seen.get(node)) is not None:
            moved_at = seen[1]
        else:
            return None
        stopped = time.monotonic() - moved_at
        return stopped if stopped >= self.lost_s else None

    def _beat(self) -> None:
        watched = range(1, self.meeting.nnodes) if self.meeting.node_rank == 0 else [0]
        while not self._stopping.wait(HEARTBEAT_S):
            try:
                self._store.add(beat_key(self.meeting.node_rank), 1)
                for node in watched:
                    if node in self._ended:
                        continue
                    counter = self._store.add(beat_key(node), 0)
                    if node and self._store.check([ended_key(node)]):
                        self._ended.add(node)
                    before = self._seen.get(node)
                    if before is None or before[0] != counter:
                        self._seen[node] = (counter, time.monotonic())
                self._answered_at = time.monotonic()
            except Exception:  # the store's errors: node 0 gone, or its link (the judge tells from the time)
                time.sleep(HEARTBEAT_S)

    def _judge_tick(self) -> None:
        for node in range(self.meeting.nnodes):
            stopped = self.stopped_for(node)
            if stopped is not None and (self.meeting.node_rank == 0 or node == 0):
                self.lost_node = node
                self._judge.stop()  # from its own thread: the loop ends as this tick returns
                self._lost(node, stopped)
                return
