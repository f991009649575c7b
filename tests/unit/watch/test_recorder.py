"""RunRecorder on a fake clock: steps from the gaps between next() calls, epochs, thinning; and the progress lines."""

from __future__ import annotations

import itertools
import sys

import pytest

from loaderdoctor.loader.facts import LoaderFacts
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.words import duration, money
from loaderdoctor.recording.rates import delivered_batches, training_rate
from loaderdoctor.recording.record import wait_fraction
from loaderdoctor.rules import diagnose
from loaderdoctor.tap.events import BatchDelivered, BatchFailed, EpochEnded, IteratorCreated
from loaderdoctor.watch.progress import Progress, epoch_line, eta_s, progress_line
from loaderdoctor.watch.recorder import RunRecorder


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _recorder(clock: Clock, *, batches_per_epoch: int | None = 10, workers: int = 0, **kwargs) -> RunRecorder:
    facts = LoaderFacts(
        batch_size=4,
        batches_per_epoch=batches_per_epoch,
        iterable=False,
        dataset="Toy",
        dataset_len=40,
    )
    return RunRecorder(facts, Settings(num_workers=workers), clock=clock, **kwargs)


def _loop(recorder: RunRecorder, clock: Clock, *, epoch: int, batches: int, wait_s: float, step_s: float) -> None:
    """A training loop's epoch as the tap reports it: iter(), each batch after `wait_s` in next(), then a step of
    `step_s` outside next(), then the next() that ends the epoch."""
    recorder.on_event(IteratorCreated(epoch, None, [], 0.0))
    for index in range(batches):
        clock.now += wait_s
        first = wait_s if index == 0 else None
        recorder.on_event(BatchDelivered(epoch, index, wait_s, 0.0, 64, 4, first))
        clock.now += step_s
    clock.now += 0.001
    recorder.on_event(EpochEnded(epoch, batches, 0.0, 0.001))


def test_steps_are_the_time_outside_next_and_the_rules_see_a_starved_loop():
    clock = Clock()
    recorder = _recorder(clock)
    for epoch in range(2):
        _loop(recorder, clock, epoch=epoch, batches=10, wait_s=0.06, step_s=0.02)
    rec = recorder.finish()
    assert [b.step_s for b in rec.batches] == pytest.approx([0.02] * 20)
    assert rec.step_s == pytest.approx(0.02)
    assert [e.batches for e in rec.epochs] == [10, 10]
    assert [e.ended for e in rec.epochs] == ["exhausted", "exhausted"]
    assert wait_fraction(rec) == pytest.approx(0.75)
    assert training_rate(rec) == pytest.approx(1 / 0.08, rel=0.05)
    findings = diagnose(rec)
    assert findings and findings[0].rule == "input-bound"


def test_a_healthy_loop_gets_no_warning():
    clock = Clock()
    recorder = _recorder(clock)
    for epoch in range(2):
        _loop(recorder, clock, epoch=epoch, batches=10, wait_s=0.0005, step_s=0.05)
    rec = recorder.finish()
    assert wait_fraction(rec) == pytest.approx(0.0099, abs=0.001)
    assert not [f for f in diagnose(rec) if f.severity in ("critical", "warning")]


def test_a_loop_that_leaves_an_epoch_early_and_a_step_under_way():
    clock = Clock()
    recorder = _recorder(clock)
    recorder.on_event(IteratorCreated(0, None, [], 0.0))
    for index in range(3):
        clock.now += 0.01
        recorder.on_event(BatchDelivered(0, index, 0.01, 0.0, 64, 4, 0.01 if index == 0 else None))
        clock.now += 0.03
    clock.now += 5.0  # validation, say: then the next epoch's iter()
    _loop(recorder, clock, epoch=1, batches=2, wait_s=0.01, step_s=0.03)
    rec = recorder.finish()
    assert [e.ended for e in rec.epochs] == ["left", "exhausted"]
    # The last step of the epoch left is unknown: the typical step stands in, not the 5 s of validation.
    assert max(b.step_s for b in rec.batches) == pytest.approx(0.03)


def test_a_guards_restart_stays_in_its_epoch_and_failures_are_recorded():
    clock = Clock()
    recorder = _recorder(clock, workers=2)
    recorder.on_event(IteratorCreated(0, None, [11, 12], 0.0))
    clock.now += 0.1
    recorder.on_event(BatchDelivered(0, 0, 0.1, 0.0, 64, 4, 0.1))
    clock.now += 0.02
    recorder.on_event(BatchFailed(0, 1, 0.0, ValueError("bad sample")))
    recorder.on_event(IteratorCreated(0, None, [13, 14], 0.05))  # restarted within epoch 0
    clock.now += 0.1
    recorder.on_event(BatchDelivered(0, 0, 0.1, 0.0, 64, 4, 0.1))
    rec = recorder.finish()
    assert len(rec.epochs) == 1 and rec.epochs[0].batches == 2
    assert recorder.last_tally is not None and recorder.last_tally.restarts == 1
    # The failed batch keeps its place (batch 1, as its error says), across the new iterator whose own count
    # starts again at 0: one numbering of an epoch's batches, the probe's too (recording/epochbook.py).
    assert [b.index for b in rec.batches] == [0, 2]
    assert [(e.batch, e.error_type) for e in rec.sample_errors] == [(1, "ValueError")]
    # The restart's first batch holds its workers' start-up: not steady running, and the epoch says it restarted.
    assert [b.after_restart for b in rec.batches] == [False, True] and rec.epochs[0].restarts == 1


def test_a_long_run_keeps_a_bounded_even_thinning_and_counts_every_batch():
    clock = Clock()
    recorder = _recorder(clock, batches_per_epoch=None, max_batches=100)
    _loop(recorder, clock, epoch=0, batches=1000, wait_s=0.01, step_s=0.03)
    rec = recorder.finish()
    assert len(rec.batches) <= 100
    assert delivered_batches(rec) == 1000
    assert rec.batches[0].index == 0  # the start-up batch stays
    assert wait_fraction(rec) == pytest.approx(0.25)
    indices = [b.index for b in rec.batches[1:]]
    gaps = {b - a for a, b in itertools.pairwise(indices)}
    assert len(gaps) <= 2  # evenly spread over the run, not only its start


def test_the_samplers_epoch_is_read_at_each_iter_and_an_unchanged_one_is_flagged():
    clock = Clock()
    epochs_held = iter([0, 0, 0])
    recorder = _recorder(clock, sampler_epoch=lambda: next(epochs_held))
    for epoch in range(3):
        _loop(recorder, clock, epoch=epoch, batches=5, wait_s=0.001, step_s=0.02)
    rec = recorder.finish()
    assert [e.sampler_epoch for e in rec.epochs] == [0, 0, 0]
    rules = {f.rule: f for f in diagnose(rec)}
    assert "set_epoch() was never called" in rules["distributed-sampler"].title

    clock = Clock()
    epochs_held = iter([0, 1, 2])
    recorder = _recorder(clock, sampler_epoch=lambda: next(epochs_held))
    for epoch in range(3):
        _loop(recorder, clock, epoch=epoch, batches=5, wait_s=0.001, step_s=0.02)
    assert "distributed-sampler" not in {f.rule for f in diagnose(recorder.finish())}


def test_progress_lines_give_rate_wait_eta_and_cost():
    p = Progress(
        name="train",
        epoch=1,
        epochs=10,
        batch=1200,
        batches_per_epoch=5000,
        batches_per_s=40.0,
        samples_per_s=640.0,
        wait_share=0.4,
        cost_per_hour=3.0,
    )
    assert eta_s(p) == pytest.approx((3800 / 40, (3800 + 8 * 5000) / 40))
    line = progress_line(p)
    assert "epoch 2/10, batch 1,200/5,000" in line
    assert "40.0 batches/s (640 samples/s)" in line
    assert "waiting for data 40% of the time" in line
    assert "epoch ends in 1 min 35 s, the run in 18 min 15 s" in line
    assert "the wait costs $1.20 per hour" in line
    stuck = Progress("val", 0, None, 0, None, None, None, None, waiting_s=7200.0)
    assert (
        progress_line(stuck)
        == "watch 'val': epoch 1, batch 0: no batch in this stretch; waiting 2 h for the next batch"
    )
    done = epoch_line(p, wall_s=125.0)
    assert "epoch 2/10 done: 1,200 batches in 2 min 5 s" in done
    assert "the wait cost $0.04 this epoch" in done


def test_words_for_durations_and_money():
    assert [duration(s) for s in (0.25, 12.4, 101, 3600, 9060, 90000)] == [
        "250 ms",
        "12 s",
        "1 min 41 s",
        "1 h",
        "2 h 31 min",
        "1 d 1 h",
    ]
    assert [money(x) for x in (0.4213, 40.0, 1250.4)] == ["$0.42", "$40.00", "$1,250"]


def test_the_run_samples_its_workers_at_once_as_those_an_iter_started_have_each_delivered_a_batch(monkeypatch):
    clock, woken = Clock(), []
    recorder = _recorder(clock, workers=2)
    poller = recorder.worker_poller(lambda: [])  # not started: only its wake is watched
    monkeypatch.setattr(poller, "poll_soon", lambda: woken.append(recorder.delivered))
    for epoch, pids in enumerate(([11, 12], [11, 12], [21, 22])):  # persistent, then started again
        recorder.on_event(IteratorCreated(epoch, None, pids, 0.0))
        for index in range(4):
            clock.now += 0.01
            recorder.on_event(BatchDelivered(epoch, index, 0.01, 0.0, 64, 4, 0.01 if index == 0 else None))
    assert woken == [1, 9]  # at batch 1 of epochs 0 and 2 (the batches delivered before it: 1, then 9)


def _started(recorder: RunRecorder, clock: Clock, batches: int = 3) -> None:
    recorder.on_event(IteratorCreated(0, None, [11, 12], 0.0))
    for index in range(batches):
        clock.now += 0.01
        recorder.on_event(BatchDelivered(0, index, 0.01, 0.0, 64, 4, 0.01 if index == 0 else None))


def test_a_workers_end_the_death_watch_told_is_a_death_where_the_loop_was_with_the_index_it_held(monkeypatch):
    from loaderdoctor.tap import signals
    from loaderdoctor.tap.deathwatch import WorkerEnd

    monkeypatch.setattr(signals, "_stops", {})
    clock = Clock()
    recorder = _recorder(clock, workers=2)
    _started(recorder, clock)
    recorder.note_end(WorkerEnd(12, 1, -11, 137, 5.0))  # told from torch's SIGCHLD, wherever the loop was
    rec = recorder.finish()
    assert [(d.epoch, d.batch, d.pid, d.exitcode, d.index) for d in rec.worker_deaths] == [(0, 3, 12, -11, 137)]
    assert rec.outcome == "crashed"
    finding = diagnose(rec)[0]
    assert (finding.rule, finding.severity, finding.evidence["index"]) == ("worker-crash", "critical", 137)


def test_a_death_told_twice_is_written_once_and_the_told_one_keeps_its_index(monkeypatch):
    from loaderdoctor.recording.record import WorkerDeath
    from loaderdoctor.tap import signals
    from loaderdoctor.tap.deathwatch import WorkerEnd

    monkeypatch.setattr(signals, "_stops", {})
    clock = Clock()

    def death(epoch, index, error):
        return WorkerDeath(epoch, index, str(error), pid=12, exitcode=-11)

    recorder = _recorder(clock, workers=2, is_death=lambda error: True, death=death)
    _started(recorder, clock)
    recorder.note_end(WorkerEnd(12, 1, -11, 137, 5.0))
    recorder.on_event(BatchFailed(0, 3, 0.0, RuntimeError("DataLoader worker (pid 12) is killed by signal")))
    rec = recorder.finish()
    assert [(d.pid, d.index) for d in rec.worker_deaths] == [(12, 137)]


def test_workers_stopped_with_the_job_are_no_deaths(monkeypatch):
    import signal
    import time

    from loaderdoctor.recording.record import WorkerDeath
    from loaderdoctor.tap import signals
    from loaderdoctor.tap.deathwatch import WorkerEnd

    monkeypatch.setattr(signals, "_stops", {})
    clock = Clock()
    term = -signal.SIGTERM

    def death(epoch, index, error):
        return WorkerDeath(epoch, index, str(error), pid=11, exitcode=term)

    recorder = _recorder(clock, workers=2, is_death=lambda error: True, death=death)
    _started(recorder, clock)
    recorder.note_end(WorkerEnd(12, 1, term, None, time.monotonic()))  # told before this process got its SIGTERM
    recorder.on_event(BatchFailed(0, 3, 0.0, RuntimeError("DataLoader worker (pid 11) is killed by signal")))
    assert len(recorder.rec.worker_deaths) == 2  # deaths, as far as anyone knows yet
    signals.note_stop(signal.SIGTERM)  # the scheduler's SIGTERM to the whole group reaches this process
    rec = recorder.finish()
    assert rec.worker_deaths == [] and rec.outcome == "completed"
    assert not [f for f in diagnose(rec) if f.rule == "worker-crash"]


def test_a_worker_that_ended_cleanly_on_ctrl_c_is_no_death(monkeypatch):
    """torch's workers catch the KeyboardInterrupt that a terminal's Ctrl-C raises in them too, and exit with status
    0 (1 when it comes as one starts): torch then calls them "exited unexpectedly". With this process's own stop a
    moment before, that is the stop's doing; without one, it is a death."""
    import signal

    from loaderdoctor.recording.record import WorkerDeath
    from loaderdoctor.tap import signals

    monkeypatch.setattr(signals, "_stops", {})

    for exitcode, stop in [(0, signal.SIGINT), (1, signal.SIGINT), (0, signal.SIGTERM), (1, signal.SIGTERM), (0, None)]:

        def death(epoch, index, error, exitcode=exitcode):
            return WorkerDeath(epoch, index, str(error), pid=11, exitcode=exitcode)

        clock = Clock()
        recorder = _recorder(clock, workers=2, is_death=lambda error: True, death=death)
        _started(recorder, clock)
        if stop is not None:
            signals.note_stop(stop)
        recorder.on_event(BatchFailed(0, 3, 0.0, RuntimeError("DataLoader worker (pid(s) 11) exited unexpectedly")))
        rec = recorder.finish()
        # Status 1 is a Python worker's own end on Ctrl-C (a KeyboardInterrupt as it starts), not on SIGTERM
        stopped = stop is not None and (exitcode == 0 or stop == signal.SIGINT)
        assert [d.pid for d in rec.worker_deaths] == ([] if stopped else [11]), (exitcode, stop)
        monkeypatch.setattr(signals, "_stops", {})


def test_the_first_epochs_draws_are_kept_up_to_the_bound_with_the_sampler(monkeypatch):
    monkeypatch.setattr(sys.modules[RunRecorder.__module__], "MAX_DRAWN", 10)
    clock = Clock()
    facts = LoaderFacts(batch_size=4, batches_per_epoch=3, sampler="RandomSampler", samples_per_epoch=12)
    recorder = RunRecorder(facts, Settings(), clock=clock)
    for epoch in range(2):
        recorder.on_event(IteratorCreated(epoch, None, [], 0.0))
        for index in range(3):
            base = 100 * epoch + 4 * index
            drawn = list(range(base, base + 4))
            recorder.on_event(BatchDelivered(epoch, index, 0.01, 0.0, 64, 4, None, drawn, drawn))
        recorder.on_event(EpochEnded(epoch, 3, 0.0))
    rec = recorder.finish()
    assert (rec.sampler, rec.sampler_distributed, rec.samples_per_epoch) == ("RandomSampler", False, 12)
    assert rec.drawn_indices == list(range(10))  # the tap notes the first epoch's only; at most the bound here
    assert rec.drawn_fingerprints == list(range(10))  # the first epoch's, though the tap fingerprints every one
    assert _recorder(Clock()).finish().drawn_indices is None  # none noted


def test_the_run_so_far_is_a_copy_of_what_finish_would_give_and_the_run_goes_on():
    clock = Clock()
    recorder = _recorder(clock)
    _loop(recorder, clock, epoch=0, batches=10, wait_s=0.06, step_s=0.02)
    recorder.on_event(IteratorCreated(1, None, [], 0.0))  # the next epoch under way: left out of the copy
    clock.now += 0.06
    recorder.on_event(BatchDelivered(1, 0, 0.06, 0.0, 64, 4, 0.06))
    so_far = recorder.so_far()
    assert [b.epoch for b in so_far.batches] == [0] * 10
    # up to the last epoch's end: the open epoch is left out, its time too (as Ray Train's shutdown after it would be)
    assert so_far.wall_s == pytest.approx(so_far.epochs[0].started_s + so_far.epochs[0].wall_s)
    assert so_far.wall_s < clock.now - 100.0
    assert diagnose(so_far)[0].rule == "input-bound"
    so_far.batches.clear()  # a copy: the run's own is untouched
    clock.now += 0.02
    for index in range(1, 10):
        clock.now += 0.06
        recorder.on_event(BatchDelivered(1, index, 0.06, 0.0, 64, 4, None))
        clock.now += 0.02
    recorder.on_event(EpochEnded(1, 10, 0.0, 0.001))
    rec = recorder.finish()
    assert [e.batches for e in rec.epochs] == [10, 10] and len(rec.batches) == 20
