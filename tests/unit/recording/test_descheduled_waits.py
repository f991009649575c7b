"""Time the training loop or a new worker was descheduled by other processes is the machine's, not the loader's:
left out of the wait for data and of a respawn's cost, so that a healthy loader is not called input-bound or
slow to restart because another job took the cores; and the tap reads it for real."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from recordings import make_recording
from torch.utils.data import DataLoader

from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import Recording, data_wait_s, wait_fraction
from loaderdoctor.rules.throughput import input_bound, worker_respawn
from loaderdoctor.tap.events import BatchDelivered
from loaderdoctor.tap.iterator import Tap
from loaderdoctor.workers.poller import thread_run_delay_s

counted = pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists() or thread_run_delay_s() is None,
    reason="the kernel keeps no schedstat counts here",
)


def _descheduled(rec: Recording, delay_s: float) -> Recording:
    """`rec` with every batch's wait of which `delay_s` was the loop's thread descheduled."""
    return dataclasses.replace(
        rec, batches=[dataclasses.replace(b, wait_run_delay_s=min(b.wait_s, delay_s)) for b in rec.batches]
    )


def test_the_wait_for_data_leaves_out_the_time_the_loop_was_descheduled():
    # 3.4 ms of waiting in next() a batch beside a 50 ms step, 2.2 ms of it the loop's thread off the cores:
    # what a loader that keeps up shows beside a CPU hog (taking each batch in waits for a core).
    rec = make_recording(wait_s=0.0034, step_s=0.05)
    assert input_bound(rec) is not None  # 6%: a warning, as before the run delay was read
    loaded = _descheduled(rec, 0.0022)
    assert data_wait_s(loaded.batches[5]) == pytest.approx(0.0012)
    assert wait_fraction(loaded) == pytest.approx(0.0012 / 0.0534, rel=0.01)
    assert input_bound(loaded) is None
    assert wait_fraction(_descheduled(rec, 1.0)) == 0.0  # never below nothing


def test_a_loop_that_really_waits_for_data_is_still_input_bound_beside_the_load():
    rec = _descheduled(make_recording(wait_s=0.04, step_s=0.05), 0.005)
    finding = input_bound(rec)
    assert finding is not None and finding.severity == "critical"
    assert finding.evidence["wait_descheduled_ms_mean"] == pytest.approx(5.0, abs=0.5)


def test_a_respawn_leaves_out_the_time_the_new_workers_waited_for_a_core():
    settings = Settings(num_workers=2)
    rec = make_recording(settings=settings, epochs=3, first_batch_s=[0.2, 0.2, 0.2], wall_s=2.0)
    assert worker_respawn(rec) is not None  # 0.15 s each epoch, against 20 batches of 0.051 s: 13% of an epoch
    epochs = [dataclasses.replace(e, first_batch_run_delay_s=0.16) for e in rec.epochs]
    loaded = dataclasses.replace(rec, epochs=epochs)
    assert worker_respawn(loaded) is None  # 0.2 - 0.16 - 0.051 s: nothing of its own
    slow = dataclasses.replace(loaded, epochs=[dataclasses.replace(e, first_batch_s=1.2) for e in epochs], wall_s=6.0)
    finding = worker_respawn(slow)
    assert finding is not None and finding.evidence["descheduled_s_per_epoch"] == 0.16
    assert finding.evidence["respawn_s_per_epoch"] == pytest.approx(1.2 - 0.16 - 0.051, abs=0.002)


def test_figures_saved_before_the_run_delay_load_without_it():
    rec = make_recording()
    data = rec.to_dict()
    for batch in data["batches"]:
        del batch["wait_run_delay_s"]
    for epoch in data["epochs"]:
        del epoch["first_batch_run_delay_s"]
    again = Recording.from_dict(data)
    assert again.batches[0].wait_run_delay_s is None and again.epochs[0].first_batch_run_delay_s is None
    assert wait_fraction(again) == wait_fraction(rec)


@counted
@pytest.mark.workers
@pytest.mark.timeout(60)
def test_the_tap_reads_the_loops_and_the_first_workers_run_delay():
    events: list[BatchDelivered] = []
    loader = DataLoader(torch.arange(64.0), batch_size=8, num_workers=1)
    tap = Tap(loader, [lambda e: events.append(e) if isinstance(e, BatchDelivered) else None], start_method="fork")
    for _ in tap.epoch(0):
        pass
    delivered = [e for e in events if isinstance(e, BatchDelivered)]
    assert len(delivered) == 8
    assert all(e.wait_run_delay_s is not None and 0.0 <= e.wait_run_delay_s <= e.wait_s for e in delivered)
    first, *rest = delivered
    assert first.startup_run_delay_s is not None and 0.0 <= first.startup_run_delay_s <= first.first_batch_s
    assert all(e.startup_run_delay_s is None for e in rest)


def test_a_loader_open_for_a_small_part_of_the_run_is_weighed_by_it():
    # A validation loader: its 2 epochs of 20 batches waited 50% of their time, and took 0.24 s of a 6 s run.
    rec = make_recording(wait_s=0.05, step_s=0.05, epochs=2, batches_per_epoch=20)
    alone = input_bound(rec)
    assert alone is not None and alone.severity == "critical" and "share_of_run" not in alone.evidence
    epochs = [dataclasses.replace(e, wall_s=0.12) for e in rec.epochs]
    validation = dataclasses.replace(rec, epochs=epochs, wall_s=6.0)
    assert input_bound(validation) is None  # 50% of 4% of the run: 2%, not worth a word
    longer = dataclasses.replace(validation, wall_s=1.0)  # 24% of the run: 12%, a warning
    finding = input_bound(longer)
    assert finding.severity == "warning" and finding.evidence["share_of_run"] == 0.24
    assert "which took 24% of the run" in finding.title
    assert finding.impact == pytest.approx(finding.evidence["wait_fraction"] * 0.24, rel=0.01)


def test_the_report_says_how_much_of_the_wait_was_descheduled_only_when_it_is_notable():
    from loaderdoctor.render.console import wait_per_batch
    from loaderdoctor.report import measurements

    rec = make_recording(wait_s=0.0034, step_s=0.05)
    quiet = measurements(_descheduled(rec, 0.00001))
    assert quiet["wait_descheduled_ms_mean"] == pytest.approx(0.01, abs=0.01)
    assert "descheduled" not in wait_per_batch(quiet)
    assert "wait_descheduled_ms_mean" not in input_bound(_descheduled(rec, 0.00001)).evidence
    loaded = measurements(_descheduled(rec, 0.0022))
    assert "3.4 ms per batch on average" in wait_per_batch(loaded)
    assert "(2.2 ms of it descheduled by other processes, not waiting for data), median" in wait_per_batch(loaded)


def test_loading_in_the_main_process_takes_its_run_delay_from_the_tap_when_it_read_it():
    from loaderdoctor.loader.settings import Settings as LoaderSettings
    from loaderdoctor.recording.usage import loading_cpu

    rec = _descheduled(make_recording(settings=LoaderSettings(), wait_s=0.04, step_s=0.01), 0.02)
    cpu = loading_cpu(rec)
    assert cpu.run_delay_share == pytest.approx(0.5, rel=0.05)  # 20 ms of each 40 ms wait off the cores


def test_where_the_loops_own_thread_loads_its_time_descheduled_in_next_is_loading():
    # Issue 49's litdata loader with num_workers=0 beside two hogs: 2,069 ms in next() a batch against a 27 ms step,
    # most of it the loop's thread descheduled. That thread was loading: the wait is all the loader's, at any load.
    from loaderdoctor.loader.settings import Settings as LoaderSettings
    from loaderdoctor.recording.record import descheduled_wait_s
    from loaderdoctor.recording.usage import LoadingCpu

    quiet = make_recording(settings=LoaderSettings(), wait_s=2.069, step_s=0.027)
    loaded = _descheduled(quiet, 1.7)
    assert wait_fraction(loaded) == pytest.approx(wait_fraction(quiet)) == pytest.approx(2.069 / 2.096, rel=0.01)
    finding = input_bound(loaded)
    assert finding is not None and finding.severity == "critical"
    assert descheduled_wait_s(loaded) is None and "wait_descheduled_ms_mean" not in finding.evidence
    # With workers, the same wait descheduled is the machine's, not the data's: left out as before.
    workers = _descheduled(make_recording(settings=LoaderSettings(num_workers=2), wait_s=2.069, step_s=0.027), 1.7)
    assert wait_fraction(workers) == pytest.approx(0.369 / 2.096, rel=0.01)
    # A share of the time is never above all of it, whatever a process's threads summed.
    # (the process's run delay is its threads' together: 1.4 s a second was printed as "descheduled 141%").
    assert LoadingCpu(0.6, 1, 2.0, None, 1.5, run_delay_cores=1.41).run_delay_share == 1.0
