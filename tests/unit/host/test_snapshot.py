"""take_snapshot() on this machine, and HostSnapshot's plain-data round trip."""

from __future__ import annotations

import json
import os
import platform
import time

import psutil
import torch

from loaderdoctor.host import snapshot
from loaderdoctor.host.snapshot import HostSnapshot, take_snapshot
from loaderdoctor.recording.record import OtherProcess, StrayProcess


def test_take_snapshot_reads_this_machine():
    started = time.perf_counter()
    taken = take_snapshot()
    elapsed_s = time.perf_counter() - started
    assert elapsed_s < 5.0  # a few ms; 0.2 s more when stray candidates are sampled; a busy machine's margin
    assert taken.hostname
    assert taken.cpu_count == os.cpu_count()
    assert 0 < taken.usable_cores <= taken.cpu_count
    assert taken.affinity_cores == len(os.sched_getaffinity(0))
    assert all(load >= 0 for load in (taken.load_avg_1m, taken.load_avg_5m, taken.load_avg_15m))
    assert 0 < taken.memory_available_bytes <= taken.memory_total_bytes
    assert taken.memory_total_bytes == psutil.virtual_memory().total
    assert 0 <= taken.swap_used_bytes <= max(taken.swap_total_bytes, taken.swap_used_bytes)
    if os.path.isdir("/dev/shm"):
        assert 0 <= taken.shm_used_bytes <= taken.shm_total_bytes
    assert taken.open_fds > 0
    assert taken.fd_soft_limit is None or taken.open_fds <= taken.fd_soft_limit
    assert isinstance(taken.stray_workers, list)
    assert taken.python_version == platform.python_version()
    assert taken.torch_version == torch.__version__
    assert taken.other_processes == []


def test_a_snapshot_round_trips_through_plain_data_and_json():
    taken = take_snapshot()
    taken.stray_workers = [StrayProcess(pid=5151, cmdline="python -c spawn_main", cpu_percent=90.0, age_s=60.0)]
    taken.other_processes = [OtherProcess(pid=4242, cmdline="python hog.py", cores=0.97)]
    data = json.loads(json.dumps(taken.to_dict()))
    again = HostSnapshot.from_dict(data)
    assert again == taken
    assert isinstance(again.stray_workers[0], StrayProcess)
    assert isinstance(again.other_processes[0], OtherProcess)


def test_from_dict_takes_older_and_newer_records():
    older = HostSnapshot.from_dict({"hostname": "gpu-1", "cpu_count": 8})
    assert older == HostSnapshot(hostname="gpu-1", cpu_count=8)
    assert older.other_processes == [] and older.stray_workers is None
    assert HostSnapshot.from_dict({"hostname": "gpu-1", "gpu_count": 4}).hostname == "gpu-1"


def test_a_fact_that_cannot_be_read_is_none_and_the_rest_are_read(monkeypatch):
    def fails(*args, **kwargs):
        raise OSError("not on this platform")

    monkeypatch.setattr(snapshot.psutil, "virtual_memory", fails)
    monkeypatch.setattr(snapshot.host, "stray_workers", fails)
    monkeypatch.setattr(snapshot.os, "getloadavg", fails)
    taken = take_snapshot()
    assert taken.memory_available_bytes is None and taken.memory_total_bytes is None
    assert taken.stray_workers is None
    assert taken.load_avg_1m is None and taken.load_avg_15m is None
    assert taken.cpu_count == os.cpu_count()
    assert taken.swap_total_bytes is not None
