"""Host facts: the cgroup CPU quota from fake files, usable cores, the facts as a whole, and other processes' CPU."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from loaderdoctor.host import facts as host
from loaderdoctor.host.facts import cgroup_cpu_quota, cpu_snapshot, host_facts, usable_cores


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_without_a_limit(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None


def test_cgroup_v2_with_a_limit(tmp_path):
    _write(tmp_path / "cpu.max", "150000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.5


def test_cgroup_v1_with_a_limit(tmp_path):
    _write(tmp_path / "cpu" / "cpu.cfs_quota_us", "50000\n")
    _write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path) == 0.5


def test_cgroup_v1_without_a_limit(tmp_path):
    _write(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path) is None


def test_cgroup_v1_is_read_when_cpu_max_is_unreadable(tmp_path):
    _write(tmp_path / "cpu.max", "garbage\n")
    _write(tmp_path / "cpu" / "cpu.cfs_quota_us", "400000\n")
    _write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path) == 4.0


def test_no_cgroup_files(tmp_path):
    assert cgroup_cpu_quota(tmp_path) is None
    assert cgroup_cpu_quota(tmp_path / "missing") is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no affinity masks on this platform")
def test_usable_cores_follow_affinity_and_quota():
    cores, affinity, quota = usable_cores()
    assert affinity == len(os.sched_getaffinity(0))
    assert quota == cgroup_cpu_quota()
    assert 0 < cores <= affinity
    if quota is None:
        assert cores == affinity
    else:
        assert cores == min(affinity, quota)


def test_usable_cores_with_a_fake_quota(monkeypatch):
    monkeypatch.setattr("loaderdoctor.host.facts.cgroup_cpu_quota", lambda: 0.5)
    cores, _, quota = usable_cores()
    assert (cores, quota) == (0.5, 0.5)


def test_host_facts(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    facts = host_facts()
    assert facts.cpu_count == os.cpu_count()
    assert 0 < facts.usable_cores <= facts.affinity_cores <= facts.cpu_count
    assert facts.local_ranks == 4
    assert facts.sharing_strategy in torch.multiprocessing.get_all_sharing_strategies()
    assert facts.accelerator == ("cuda" if torch.cuda.is_available() else None)
    if os.path.isdir("/dev/shm"):
        assert facts.shm_total_bytes > 0
        assert 0 <= facts.shm_free_bytes <= facts.shm_total_bytes
    if os.path.isdir("/proc/self/fd"):
        assert facts.open_fds > 0
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert facts.fd_soft_limit == (None if soft == resource.RLIM_INFINITY else soft)
    assert isinstance(facts.stray_workers, list)


def test_host_facts_default_to_one_local_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert host_facts().local_ranks == 1


def test_usable_cores_is_a_float_when_the_quota_is_above_the_affinity(monkeypatch):
    monkeypatch.setattr("loaderdoctor.host.facts.cgroup_cpu_quota", lambda: 4096.0)
    cores, affinity, _ = usable_cores()
    assert cores == affinity
    assert isinstance(cores, float)


class _FakeOrphan:
    def __init__(self, pid: int, cmdline: list[str]) -> None:
        self.pid = pid
        self._cmdline = cmdline

    def cmdline(self) -> list[str]:
        return self._cmdline


def test_orphans_count_as_stray_workers_only_beyond_doubt(monkeypatch):
    groups = {10: 500, 11: 500, 12: 600, 13: 700}  # pid -> process group
    monkeypatch.setattr(host.os, "getpgid", lambda pid: groups[pid])
    monkeypatch.setattr(host.psutil, "pid_exists", lambda pid: False)
    monkeypatch.setattr(host, "_has_torch", lambda proc: True)
    spawned = _FakeOrphan(20, ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"])
    forked_a, forked_b = _FakeOrphan(10, ["python", "train.py"]), _FakeOrphan(11, ["python", "train.py"])
    lone_job = _FakeOrphan(12, ["python", "nohup_job.py"])  # a training job started with nohup: not a worker
    other = _FakeOrphan(13, ["python", "train.py"])  # same command, another process group: a second job
    strays = host._orphaned_workers([spawned, forked_a, forked_b, lone_job, other])
    assert {p.pid for p in strays} == {20, 10, 11}
    monkeypatch.setattr(host.psutil, "pid_exists", lambda pid: True)  # the group's leader still runs
    assert {p.pid for p in host._orphaned_workers([forked_a, forked_b])} == set()


def _load(snapshots: list[dict], own: int) -> host.OtherLoad:
    """An OtherLoad over these snapshots in turn, the wall clock at 1.0, 2.0, 3.0..."""
    taken = iter(snapshots)
    times = iter(float(t) for t in range(1, 100))
    return host.OtherLoad(snapshot=lambda: next(taken), own=lambda: {own}, wall_clock=lambda: next(times))


def test_other_processes_are_named_by_the_cpu_they_took_and_ours_are_left_out(monkeypatch):
    own = os.getpid()
    first = {(own, 0.5): (5.0, "python"), (4242, 0.5): (10.0, "hog"), (4343, 0.5): (1.0, "idle")}
    then = {(own, 0.5): (9.0, "python"), (4242, 0.5): (12.0, "hog"), (4343, 0.5): (1.05, "idle")}
    monkeypatch.setattr(host.psutil, "Process", _NamedProcess)
    load = _load([first, then], own)
    load.observe()
    (busy,) = load.busiest(seconds=2.0)
    # 2 CPU seconds in 2 s (idle: 0.025); named by its program, not its arguments, and as this user's own
    assert (busy.pid, busy.cores, busy.cmdline, busy.same_user) == (4242, 1.0, "hog", True)


def test_another_users_process_is_named_as_not_ours(monkeypatch):
    monkeypatch.setattr(host.psutil, "Process", _NamedProcess)
    load = _load([{(77, 0.5): (10.0, "hog")}, {(77, 0.5): (12.0, "hog")}], os.getpid())
    load.observe()
    (busy,) = load.busiest(seconds=2.0)
    assert (busy.pid, busy.same_user) == (77, False)


def test_a_process_that_comes_and_goes_between_snapshots_is_counted_for_what_it_took(monkeypatch):
    """A job that starts after the run began and ends before it closes (another user's, say) is still named:
    what it used is added at every snapshot, while it runs."""
    monkeypatch.setattr(host.psutil, "Process", _NamedProcess)
    own = os.getpid()
    start = {(own, 0.5): (1.0, "python")}
    hog_started = {(own, 0.5): (2.0, "python"), (4242, 1.5): (3.0, "hog")}  # created after the first snapshot
    hog_running = {(own, 0.5): (3.0, "python"), (4242, 1.5): (6.0, "hog")}
    hog_gone = {(own, 0.5): (4.0, "python")}
    load = _load([start, hog_started, hog_running, hog_gone], own)
    for _ in range(3):
        load.observe()
    (hog,) = load.busiest(seconds=6.0)
    assert (hog.pid, hog.cores, hog.cmdline) == (4242, 1.0, "hog")  # 3 + 3 CPU seconds over 6 s


def test_a_process_seen_late_is_not_charged_with_cpu_from_before_the_run():
    """A process older than the last snapshot but missing from it (unreadable then) has no baseline: its CPU
    seconds since it started are not the run's; and a pid reused by a new process is another process."""
    old_unread = {(4242, 0.2): (500.0, "old")}
    load = _load([{}, old_unread, {(4242, 0.2): (501.0, "old"), (4242, 2.5): (0.5, "new")}], os.getpid())
    load.observe()
    assert load.busiest(seconds=2.0) == []
    load.observe()
    # The old one's last second only (1 CPU second); the new one since it started (0.5), apart.
    assert [(p.pid, p.cores) for p in load.busiest(seconds=2.0)] == [(4242, 0.5), (4242, 0.25)]


def test_a_snapshot_holds_this_process():
    snapshot = cpu_snapshot()
    assert any(pid == os.getpid() for pid, _ in snapshot)


class _NamedProcess:
    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid

    def children(self, recursive: bool = False) -> list:
        return []

    def cmdline(self) -> list[str]:
        return ["hog", "--spin"]

    def uids(self) -> SimpleNamespace:
        # pid 4242 runs as this user; any other as another one
        real = os.getuid() if self.pid == 4242 else os.getuid() + 1
        return SimpleNamespace(real=real, effective=real, saved=real)
