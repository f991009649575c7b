"""Threads are judged by the CPU they burn, not counted (issue 49): litdata starts 4 nearly idle threads per
worker and MosaicML streaming 5, which were called critical oversubscription; a pool that computes while the
cores are saturated still is. The poller reads each thread's CPU for real."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from recordings import make_recording
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import Recording
from loaderdoctor.recording.threads import BUSY_THREAD_CORES, busy_threads_per_worker, worker_threads
from loaderdoctor.rules.host import cpu_oversubscription
from loaderdoctor.workers.poller import WorkerPoller, thread_counts

FOUR = Settings(num_workers=4, persistent_workers=True)


def _threads_using(rec: Recording, cores: list[float]) -> Recording:
    """`rec` whose every worker ran len(cores) threads, thread k keeping cores[k] of a core busy (thread 0 is
    the worker's main one, its id the pid), the worker's CPU their sum."""
    samples = []
    for s in rec.worker_samples:
        per_thread = {str(s.pid) if k == 0 else f"{s.pid}{k}": c * s.t_s for k, c in enumerate(cores)}
        samples.append(
            dataclasses.replace(s, cpu_s=sum(per_thread.values()), threads=len(cores), thread_cpu_s=per_thread)
        )
    return dataclasses.replace(rec, worker_samples=samples)


def test_idle_library_threads_beside_a_busy_worker_are_no_oversubscription():
    # 4 workers on 2 cores, each its main thread at half a core and 4 threads asleep (litdata's): the cores are
    # full, and 4 workers compete for them, but each computes on one thread.
    rec = _threads_using(make_recording(settings=FOUR, wait_s=0.03), [0.5, 0.01, 0.0, 0.02, 0.0])
    assert busy_threads_per_worker(rec) == 1
    finding = cpu_oversubscription(rec)
    assert finding is not None and finding.title == "4 workers compete for 2 usable cores"  # the workers, not threads
    assert finding.settings_change == {"num_workers": 2} and "worker_threads" not in finding.settings_change
    assert finding.evidence["busy_threads_per_worker"] == 1
    two = _threads_using(make_recording(settings=Settings(num_workers=2), wait_s=0.03), [0.9, 0.01, 0.0, 0.02])
    assert cpu_oversubscription(two) is None  # as many workers as cores: nothing competes


def test_a_pool_that_computes_while_the_cores_are_saturated_competes():
    # 2 workers on 2 cores, each with OpenCV's pool busy beside its main thread: 6 threads computing.
    rec = _threads_using(make_recording(settings=Settings(num_workers=2), wait_s=0.03), [0.4, 0.3, 0.3])
    finding = cpu_oversubscription(rec)
    assert finding is not None and finding.title == "2 workers × 3 busy threads compete for 2 usable cores"
    assert finding.settings_change == {"worker_threads": 1}
    assert finding.evidence["pool_cores_per_worker"] == pytest.approx(0.6)
    assert 'sys.modules["cv2"].setNumThreads(1)' in finding.snippet


def test_a_pool_spread_thin_over_the_cores_still_computes():
    # The oversubscribed scenario: 16 torch threads in each of 2 workers on 2 cores, a sixteenth of a core each.
    rec = _threads_using(make_recording(settings=Settings(num_workers=2), wait_s=0.03), [0.07] + [0.06] * 15)
    assert busy_threads_per_worker(rec) == 16
    finding = cpu_oversubscription(rec)
    assert finding is not None and finding.title == "2 workers × 16 busy threads compete for 2 usable cores"


def test_a_large_pool_that_sleeps_is_nothing_even_where_it_is_far_beyond_the_cores():
    # 2 workers with 16 threads each (a pool per core of a larger machine), all but the main one asleep; the
    # machine's use unknown (as under `run` with no samples of it): counted, this was "critical".
    rec = _threads_using(make_recording(settings=Settings(num_workers=2), wait_s=0.03), [0.9] + [0.0] * 15)
    assert cpu_oversubscription(dataclasses.replace(rec, host_samples=[])) is None
    assert cpu_oversubscription(rec) is None
    counted = make_recording(settings=Settings(num_workers=2), wait_s=0.03, threads_per_worker=16)
    assert cpu_oversubscription(counted) is not None  # a report saved before threads were read: judged as then


def test_a_measurement_too_short_for_steady_ticks_reads_threads_from_first_to_last():
    rec = _threads_using(make_recording(settings=FOUR, wall_s=0.5), [0.5, 0.3])
    found = worker_threads(dataclasses.replace(rec, windows=[]))
    assert found and all(w.busy == 2 for w in found)
    assert all(w.beside_main == pytest.approx(0.3) for w in found)


def test_thread_counts_reads_each_threads_cpu_and_the_run_delay_in_one_pass(tmp_path):
    task = tmp_path / "77" / "task"
    for tid, (utime, stime) in {"77": (300, 100), "78": (5, 0)}.items():
        (task / tid).mkdir(parents=True)
        fields = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 30
        (task / tid / "stat").write_text(f"{tid} (pt_data worker) " + " ".join(fields))
        (task / tid / "schedstat").write_text("1000 2000000000 4\n")
    delay, cpu = thread_counts(77, proc=tmp_path)
    ticks = os.sysconf("SC_CLK_TCK")
    assert delay == pytest.approx(4.0)
    assert cpu == {"77": pytest.approx(400 / ticks), "78": pytest.approx(5 / ticks)}
    assert thread_counts(78, proc=tmp_path) == (None, None)  # gone


class SpinsBesideSleepers(Dataset):
    """Each worker starts, with its first sample, one thread that spins and three that sleep."""

    started = False

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if not SpinsBesideSleepers.started:
            SpinsBesideSleepers.started = True
            threading.Thread(target=_spin, daemon=True).start()
            for _ in range(3):
                threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        time.sleep(0.002)
        return torch.zeros(2)


def _spin() -> None:
    while True:
        sum(range(10_000))


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="no /proc here")
@pytest.mark.workers
@pytest.mark.timeout(60)
def test_the_poller_tells_a_thread_that_spins_from_those_that_sleep():
    loader = DataLoader(SpinsBesideSleepers(), batch_size=4, num_workers=1, multiprocessing_context="fork")
    iterator = iter(loader)
    next(iterator)
    pid = iterator._workers[0].pid
    poller = WorkerPoller(lambda: [pid], interval_s=0.2).start()
    try:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            next(iterator)
    finally:
        poller.stop()
        iterator._shutdown_workers()
    readings = [r for r in poller.readings if r.thread_cpu_s]
    first, last = readings[0], readings[-1]
    seconds = last.t_s - first.t_s
    cores = {tid: (last.thread_cpu_s[tid] - used) / seconds for tid, used in first.thread_cpu_s.items()}
    busy = [tid for tid, c in cores.items() if c >= BUSY_THREAD_CORES]
    assert len(cores) >= 5 and len(busy) >= 1, cores  # the spinner (and the worker's own thread, loading)
    assert sum(c < BUSY_THREAD_CORES for c in cores.values()) >= 3, cores  # the three that sleep
