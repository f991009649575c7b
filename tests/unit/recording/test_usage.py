"""What loading used: its CPU against the cores it could have (not per worker), other processes' share, and
workers' memory from their first batch on. Hand-made recordings with exact figures."""

from __future__ import annotations

import dataclasses

import pytest
from recordings import MIB, make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import HostReading, WorkerReading
from loaderdoctor.recording.usage import loading_cpu, other_cores, worker_growth, worker_uss_after_startup

FOUR = Settings(num_workers=4, persistent_workers=True)


def _host_samples(wall_s: float, *, others: float, main: float, workers: float) -> list[HostReading]:
    """The machine every 0.25 s: other processes, the training process and its workers at these cores."""
    count = int(wall_s / 0.25) + 1
    return [
        HostReading(t_s=t, busy_cpu_s=(others + main + workers) * t, main_cpu_s=main * t)
        for t in (wall_s * i / (count - 1) for i in range(count))
    ]


def test_four_cpu_bound_workers_on_two_cores_are_computing_all_they_can():
    # Each worker gets half a core: 0.5 each, 2.0 in all, which is every core there is.
    rec = make_recording(settings=FOUR, cpu_share=0.5, step_s=0.02, wait_s=0.05)
    cpu = loading_cpu(rec)
    assert cpu.cores == pytest.approx(2.0, rel=0.01)
    assert cpu.capacity == 2.0
    assert cpu.share == pytest.approx(1.0, rel=0.01)


def test_waiting_workers_use_little_of_what_they_could():
    rec = make_recording(settings=FOUR, cpu_share=0.1, step_s=0.02, wait_s=0.05)
    cpu = loading_cpu(rec)
    assert cpu.cores == pytest.approx(0.4, rel=0.01)
    assert cpu.share == pytest.approx(0.2, rel=0.01)
    assert cpu.per_loader == pytest.approx(0.1, rel=0.01)


def test_other_processes_take_cores_from_what_loading_could_use():
    rec = make_recording(settings=FOUR, cpu_share=0.25, step_s=0.02, wait_s=0.05)
    rec.host_samples = _host_samples(rec.wall_s, others=1.0, main=0.0, workers=1.0)
    cpu = loading_cpu(rec)
    assert cpu.other_cores == pytest.approx(1.0, rel=0.02)
    assert other_cores(rec) == pytest.approx(1.0, rel=0.02)
    assert cpu.available_cores == pytest.approx(1.0, rel=0.02)
    assert cpu.share == pytest.approx(1.0, rel=0.03)  # a busy host: still CPU-bound, not waiting
    assert cpu.machine_share == pytest.approx(1.0, rel=0.03)


def test_the_training_process_own_cpu_is_not_loadings_to_use():
    rec = make_recording(settings=Settings(num_workers=2, persistent_workers=True), cpu_share=0.6)
    rec.host_samples = _host_samples(rec.wall_s, others=0.0, main=0.8, workers=1.2)
    cpu = loading_cpu(rec)
    assert cpu.main_cores == pytest.approx(0.8, rel=0.02)
    assert cpu.available_cores == pytest.approx(1.2, rel=0.02)
    assert cpu.share == pytest.approx(1.0, rel=0.03)


def test_loading_in_the_main_process_is_its_cpu_while_it_waited():
    rec = make_recording(settings=Settings(), wait_s=0.02, wait_cpu_share=0.75)
    cpu = loading_cpu(rec)
    assert cpu.cores == pytest.approx(0.75)
    assert cpu.capacity == 1.0
    assert cpu.share == pytest.approx(0.75)


def test_main_process_loading_on_several_threads_used_all_it_could_never_more():
    # torch ops in __getitem__ ran on two threads: 1.89 cores while the loop waited, the process counted as one
    rec = make_recording(settings=Settings(), wait_s=0.02, wait_cpu_share=1.89)
    cpu = loading_cpu(rec)
    assert cpu.cores == pytest.approx(1.89)
    assert cpu.share == 1.0  # said "189%" before
    assert cpu.compute_share == 1.0


def test_start_up_cpu_is_not_loading():
    # Spawned workers import torch for a second at full speed, then wait at 10% of a core.
    rec = make_recording(settings=FOUR, cpu_share=0.1, first_batch_s=[1.0, 0.01], step_s=0.02, wait_s=0.05)
    for sample in rec.worker_samples:
        sample.cpu_s = sample.t_s if sample.t_s <= 1.0 else 1.0 + 0.1 * (sample.t_s - 1.0)
    assert loading_cpu(rec).cores == pytest.approx(0.4, rel=0.05)


def test_unknown_without_samples_or_waits():
    assert loading_cpu(make_recording(settings=FOUR, worker_samples=[])) is None
    assert loading_cpu(make_recording(settings=Settings(), wait_s=0.0, first_batch_s=0.0)) is None


def _sample(pid: int, t_s: float, uss_mb: float) -> WorkerReading:
    return WorkerReading(t_s, pid, int(uss_mb * MIB), int(uss_mb * MIB), 0.0, 1)


def test_memory_grows_only_after_start_up():
    # A spawned worker imports torch (42 -> 235 MB) before its first batch at 2.0 s, then stays level.
    rec = make_recording(settings=Settings(num_workers=1, start_method="spawn"), first_batch_s=[2.0, 0.01])
    rec.epochs[0].worker_pids = [7]
    rec.worker_samples = [_sample(7, t / 4, 42 + min(t / 8, 1.0) * 193) for t in range(0, 21)]
    assert rec.batches[0].delivered_s == pytest.approx(2.0)
    first, last, _ = worker_growth(rec)[7]
    assert first == last == 235 * MIB
    assert min(worker_uss_after_startup(rec)) == 235 * MIB


def test_a_later_worker_starts_with_its_own_first_batch():
    rec = make_recording(settings=Settings(num_workers=2, start_method="spawn"), first_batch_s=[2.0, 0.01])
    rec.epochs[0].worker_pids = [7, 8]
    second = rec.batches[1].delivered_s  # worker 1's first batch, after worker 0's
    rec.worker_samples = [_sample(8, second - 0.01, 100), _sample(8, second, 200), _sample(8, second + 1, 200)]
    assert worker_growth(rec)[8] == (200 * MIB, 200 * MIB, 1.0)


def test_rounds_that_read_the_cpu_only_are_no_memory_figure():
    # A measuring window's edges read the workers' CPU only (their USS is None): memory is read where it was read.
    rec = make_recording(settings=Settings(num_workers=1, start_method="spawn"), first_batch_s=[2.0, 0.01])
    rec.epochs[0].worker_pids = [7]
    cpu_only = [dataclasses.replace(_sample(7, t, 0), uss_bytes=None) for t in (2.5, 3.5, 4.5)]
    rec.worker_samples = sorted([_sample(7, 3.0, 200), _sample(7, 4.0, 260), *cpu_only], key=lambda s: s.t_s)
    assert worker_growth(rec)[7] == (200 * MIB, 260 * MIB, 1.0)
    assert sorted(worker_uss_after_startup(rec)) == [200 * MIB, 260 * MIB]
    rec.worker_samples = cpu_only
    assert worker_growth(rec) == {} and worker_uss_after_startup(rec) == []
