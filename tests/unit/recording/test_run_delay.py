"""Time descheduled is neither computing nor waiting: schedstat's run delay read and recorded, the CPU-versus-waiting
decision with and without it on hand-made Recordings, and the node's cores shared by its local ranks."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from recordings import make_host, make_recording

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import HostReading, Recording
from loaderdoctor.recording.usage import loading_cpu
from loaderdoctor.rules._common import WAITING_SHARE
from loaderdoctor.rules.throughput import input_bound
from loaderdoctor.workers.poller import WorkerPoller, parse_run_delay_s, run_delay_s

TWO = Settings(num_workers=2, persistent_workers=True)
SCHEDSTAT = Path(f"/proc/self/task/{os.getpid()}/schedstat")


# Reading it


def test_the_run_delay_is_schedstats_second_field_in_seconds():
    assert parse_run_delay_s("481117185 76950924 134\n") == pytest.approx(0.076950924)
    assert parse_run_delay_s("0 62643 1") == pytest.approx(62643e-9)  # a thread that has just started
    assert parse_run_delay_s("0 0 0\n") is None  # what the kernel writes where it keeps no such counts
    assert parse_run_delay_s("") is None
    assert parse_run_delay_s("not schedstat") is None


def _task(proc: Path, pid: int, tid: int, text: str) -> None:
    folder = proc / str(pid) / "task" / str(tid)
    folder.mkdir(parents=True)
    (folder / "schedstat").write_text(text)


def test_a_process_run_delay_sums_its_threads(tmp_path):
    _task(tmp_path, 7, 7, "900000000 600000000 40\n")  # the loading thread: 0.6 s runnable but not running
    _task(tmp_path, 7, 8, "1000000 50000000 9\n")
    _task(tmp_path, 7, 9, "0 0 0\n")  # not counted: no part of the sum
    assert run_delay_s(7, tmp_path) == pytest.approx(0.65)
    _task(tmp_path, 8, 8, "0 0 0\n")
    assert run_delay_s(8, tmp_path) is None  # the kernel counts nothing: unknown, not zero
    assert run_delay_s(9, tmp_path) is None  # no such process (or no schedstat at all): as before, unknown


@pytest.mark.skipif(not SCHEDSTAT.exists(), reason="this kernel keeps no schedstat")
def test_the_sampler_records_the_run_delay_of_workers_and_of_the_training_process():
    poller = WorkerPoller(lambda: [os.getpid()])
    poller.poll_once()
    (sample,) = poller.readings
    (host,) = poller.host_readings
    assert sample.run_delay_s is not None and sample.run_delay_s >= 0.0
    assert host.main_run_delay_s is not None and host.main_run_delay_s >= 0.0


def test_reports_saved_before_the_run_delay_load_with_it_unknown():
    rec = make_recording(settings=TWO)
    rec.host_samples = [HostReading(t_s=0.0, busy_cpu_s=1.0, main_cpu_s=0.5)]
    data = rec.to_dict()
    for sample in data["worker_samples"] + data["host_samples"]:
        sample.pop("run_delay_s", None)
        sample.pop("main_run_delay_s", None)
    loaded = Recording.from_dict(data)
    assert all(s.run_delay_s is None for s in loaded.worker_samples)
    assert loaded.host_samples[0].main_run_delay_s is None
    assert loading_cpu(loaded).run_delay_cores is None


# Deciding with it


def _busy_machine(rec: Recording, *, others: float, main: float, workers: float, main_delay: float = 0.0) -> None:
    """Samples of the machine when the workers' are taken (every 0.25 s or so): other processes, the training
    process and its workers at these cores, and the training process descheduled `main_delay` of each second."""
    count = int(rec.wall_s / 0.25) + 1
    rec.host_samples = [
        HostReading(
            t_s=t,
            busy_cpu_s=(others + main + workers) * t,
            main_cpu_s=main * t,
            main_run_delay_s=main_delay * t,
        )
        for t in (rec.wall_s * i / (count - 1) for i in range(count))
    ]


def _workers_descheduled(rec: Recording, share: float) -> None:
    """Each worker ready to run but descheduled `share` of the time."""
    for sample in rec.worker_samples:
        sample.run_delay_s = share * sample.t_s


def _cpu_bound_workers_beside_hogs() -> Recording:
    """2 CPU-bound workers on 2 cores beside processes that take 1.8 of them: each worker runs 10% of the time
    and is ready but descheduled 80% (the rest: handing batches over). The step waits 80% of the time."""
    rec = make_recording(settings=TWO, cpu_share=0.1, wait_s=0.2, step_s=0.05)
    _busy_machine(rec, others=1.8, main=0.0, workers=0.2)
    return rec


def test_without_the_run_delay_descheduled_workers_look_like_waiting_as_before():
    # The kernel does not count it: the decision is today's, on CPU alone (0.2 of the 1 core left: waiting).
    cpu = loading_cpu(_cpu_bound_workers_beside_hogs())
    assert cpu.run_delay_share is None
    assert cpu.share == pytest.approx(0.2, rel=0.03)
    assert cpu.compute_share == cpu.share < WAITING_SHARE


def test_workers_descheduled_by_other_processes_are_cpu_bound_not_waiting():
    rec = _cpu_bound_workers_beside_hogs()
    _workers_descheduled(rec, 0.8)
    cpu = loading_cpu(rec)
    assert cpu.share == pytest.approx(0.2, rel=0.03)  # the CPU it used of what it could: still 20%
    assert cpu.run_delay_share == pytest.approx(0.8, rel=0.01)
    assert cpu.compute_share == pytest.approx(0.9, rel=0.01)  # running 10% + descheduled 80% of the time
    finding = input_bound(rec)
    assert finding.settings_change == {}  # 2 workers on 2 cores: no more than cores
    assert "CPU-bound" in finding.fix and "waits" not in finding.fix
    assert "descheduled 80% of the time" in finding.fix
    assert finding.evidence["loading_cpu_share"] == 0.2
    assert finding.evidence["run_delay_share"] == 0.8
    assert finding.evidence["compute_share"] == 0.9


def test_workers_that_sleep_on_io_still_wait_with_a_little_run_delay():
    # 10% running, 5% descheduled, 85% asleep: waiting on reads, whatever the run delay.
    rec = make_recording(settings=TWO, cpu_share=0.1, wait_s=0.2, step_s=0.05)
    _workers_descheduled(rec, 0.05)
    cpu = loading_cpu(rec)
    assert cpu.compute_share == pytest.approx(0.15, rel=0.01)
    finding = input_bound(rec)
    assert "waits more than it computes" in finding.fix
    assert finding.settings_change["num_workers"] > 2


def test_loading_in_the_main_process_gets_its_run_delay_in_next_by_its_cpu_there():
    # In next() the main process computes 30% of the time; over the run it used 0.3 of a core and was
    # descheduled 0.6: 2 s descheduled per CPU second, so 0.6 of each second in next() too.
    rec = make_recording(settings=Settings(), wait_s=0.2, step_s=0.05, wait_cpu_share=0.3)
    _busy_machine(rec, others=1.7, main=0.3, workers=0.0, main_delay=0.6)
    cpu = loading_cpu(rec)
    assert cpu.cores == pytest.approx(0.3)
    assert cpu.run_delay_cores == pytest.approx(0.6, rel=0.02)
    assert cpu.compute_share == pytest.approx(0.9, rel=0.02)
    finding = input_bound(rec)
    assert finding.fix.startswith("Loading computes (the main process kept 0.3 of the 1.0 available cores busy, ")
    assert finding.settings_change == {"num_workers": 2, "persistent_workers": True}  # one per core, not more
    _busy_machine(rec, others=1.7, main=0.3, workers=0.0, main_delay=0.0)
    assert loading_cpu(rec).compute_share == pytest.approx(0.3)  # not descheduled: it waits (on I/O)


def test_a_decoders_threads_descheduled_while_the_loops_thread_sleeps_on_them_are_cpu_bound():
    # PyAV decoding in the main process beside two hogs: its decoder threads ran 30% of each second in next() and
    # were kept off the cores 60% (the process's run delay), while the loop's own thread slept on their frames,
    # descheduled 2% of it. Its run delay alone says the decoder waits on I/O, and more workers than cores
    # followed (7 to 9 where 2 do quiet).
    rec = make_recording(settings=Settings(), wait_s=0.2, step_s=0.05, wait_cpu_share=0.3)
    rec.batches = [dataclasses.replace(b, wait_run_delay_s=0.02 * b.wait_s) for b in rec.batches]
    _busy_machine(rec, others=1.7, main=0.3, workers=0.0, main_delay=0.6)
    cpu = loading_cpu(rec)
    assert cpu.run_delay_cores == pytest.approx(0.6, rel=0.02)  # the process's, by its CPU in next()
    assert cpu.compute_share == pytest.approx(0.9, rel=0.02)
    assert input_bound(rec).settings_change == {"num_workers": 2, "persistent_workers": True}
    _busy_machine(rec, others=1.7, main=0.3, workers=0.0, main_delay=0.0)
    assert loading_cpu(rec).run_delay_cores == pytest.approx(0.02, rel=0.02)  # the loop's own, where it is more


# Ranks on one node


def test_two_local_ranks_halve_the_cores_each_rank_gets():
    one = loading_cpu(make_recording(settings=TWO, host=make_host(usable_cores=4.0, cpu_count=4)))
    two = loading_cpu(make_recording(settings=TWO, host=make_host(usable_cores=4.0, cpu_count=4, local_ranks=2)))
    assert (one.available_cores, one.own_cores) == (4.0, 4.0)
    assert (two.rank_cores, two.available_cores, two.own_cores) == (2.0, 2.0, 2.0)
    assert two.machine_share == one.machine_share  # the node's cores are still the node's


def test_two_ranks_sharing_two_cores_are_not_told_to_add_workers():
    # Each rank's 2 workers compute 45% of the time: 0.9 of the one core that is this rank's part.
    host = make_host(usable_cores=2.0, local_ranks=2)
    rec = make_recording(settings=TWO, host=host, cpu_share=0.45, wait_s=0.2, step_s=0.05)
    finding = input_bound(rec)
    assert finding.evidence["available_cores"] == 1.0
    assert finding.evidence["local_ranks"] == 2
    assert finding.evidence["loading_cpu_share"] == 0.9
    assert finding.settings_change.get("num_workers", 2) <= 2
    assert "CPU-bound" in finding.fix


def test_the_main_process_of_each_of_two_ranks_gets_one_worker_per_core_of_its_part():
    host = make_host(usable_cores=4.0, cpu_count=4, local_ranks=2)
    finding = input_bound(make_recording(settings=Settings(), host=host, wait_s=0.03, step_s=0.05))
    assert finding.settings_change == {"num_workers": 2, "persistent_workers": True}
