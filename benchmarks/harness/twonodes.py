"""Two real nodes on this machine for the multi-node tests: two network namespaces joined by a veth pair, each with
its own address (198.18.0.1 and 198.18.0.2, of the range set aside for tests) and, in a UTS namespace of each
command's own, its own hostname, which the namespace's /etc/hosts resolves to its address (gloo binds the address
the hostname resolves to). Made by the test as root, removed after; `skip_reason()` says why they cannot be made."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ADDRESSES = ("198.18.0.1", "198.18.0.2")
NETNS_ETC = Path("/etc/netns")


def skip_reason() -> str | None:
    """Why two namespaces cannot be made here; None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command"
    probe = f"ldprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


@dataclass
class Node:
    """One node: its namespace, its hostname and its address."""

    netns: str
    hostname: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run in this node: its network namespace, a UTS namespace with its hostname."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c",
                f'hostname {self.hostname} && exec "$@"', "sh", *argv]  # fmt: skip


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True)


@contextlib.contextmanager
def two_nodes() -> Iterator[tuple[Node, Node]]:
    """Two nodes joined by a veth pair, removed (with their /etc/netns files) however the block ends."""
    tag = uuid.uuid4().hex[:6]
    nodes = (Node(f"ld{tag}n0", f"ld{tag}-node0", ADDRESSES[0]), Node(f"ld{tag}n1", f"ld{tag}-node1", ADDRESSES[1]))
    hosts = "127.0.0.1 localhost\n" + "".join(f"{node.address} {node.hostname}\n" for node in nodes)
    made: list[Node] = []
    try:
        for node in nodes:
            _run("ip", "netns", "add", node.netns)
            made.append(node)
            (NETNS_ETC / node.netns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / node.netns / "hosts").write_text(hosts)
        _run("ip", "link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b")
        for node, link in zip(nodes, (f"v{tag}a", f"v{tag}b"), strict=True):
            _run("ip", "link", "set", link, "netns", node.netns)
            _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", link)
            _run("ip", "-n", node.netns, "link", "set", link, "up")
            _run("ip", "-n", node.netns, "link", "set", "lo", "up")
        yield nodes
    finally:
        for node in made:
            kill_node(node)  # a test that failed may leave processes; one that passed checked left_in() first
            subprocess.run(["ip", "netns", "delete", node.netns], capture_output=True)  # its veth end goes with it
            shutil.rmtree(NETNS_ETC / node.netns, ignore_errors=True)


def cut_link(node: Node) -> None:
    """The node's link to the other taken down (as a switch port or a cable fails): no packet passes either way."""
    link = subprocess.run(["ip", "-n", node.netns, "-o", "link", "show", "type", "veth"], capture_output=True,
                          text=True, check=True).stdout.split(":")[1].strip().split("@")[0]  # fmt: skip
    _run("ip", "-n", node.netns, "link", "set", link, "down")


def kill_node(node: Node) -> None:
    """Every process of the node killed at once (SIGKILL), as when its machine dies."""
    pids = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def left_in(node: Node, wait_s: float = 10.0) -> list[int]:
    """The processes still running in the node `wait_s` seconds from now (or as soon as none are)."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = [int(pid) for pid in subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True,
                                                   text=True).stdout.split()]  # fmt: skip
        alive = []
        for pid in pids:
            with contextlib.suppress(OSError):
                if not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
                    alive.append(pid)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)
