"""input-ceiling: the input's cost measured in data-free turns, said beside the waits' reading, and a warning when
the two disagree; input-bound's severity follows the measured cost when there is one."""

from __future__ import annotations

import pytest
from recordings import make_recording

from loaderdoctor.render.evidence import evidence_words
from loaderdoctor.rules import diagnose
from loaderdoctor.rules.ceiling import input_ceiling
from loaderdoctor.rules.throughput import input_bound
from loaderdoctor.tap.ceiling import Ceiling, Turn


def _ceiling(real_rate: float, free_rate: float, wait_share: float) -> Ceiling:
    turns = []
    for n in range(7):
        kind = "data-free" if n % 2 else "real"
        rate = free_rate if kind == "data-free" else real_rate
        seconds = 20 / rate
        turns.append(
            Turn(kind, 24 if kind == "real" else 20, 20, seconds, wait_share * seconds if kind == "real" else 0.0)
        )
    return Ceiling(data_free_steps=60, refill=4, turns=turns)


def test_a_measured_cost_the_waits_agree_with_is_said_as_it_is():
    rec = make_recording(ceiling=_ceiling(real_rate=10.0, free_rate=16.0, wait_share=0.40))
    finding = input_ceiling(rec)
    assert finding.severity == "info"
    assert finding.title == (
        "With its input taken away the loop ran 1.60x as fast: the input costs 38% of its time (its waits said 40%)"
    )
    assert finding.evidence["measured_input_cost"] == pytest.approx(0.375)
    assert finding.evidence["turn_speedups"] == [1.6, 1.6, 1.6]
    assert "60 data-free steps trained on batches it had already seen" in finding.fix


def test_waits_that_overstate_the_input_as_on_an_asynchronous_device_are_called_wrong():
    # 84% of the loop's time in next(), yet only 2.3x faster without the input (the GPU busy meanwhile)
    rec = make_recording(ceiling=_ceiling(real_rate=40.0, free_rate=92.0, wait_share=0.84))
    finding = input_ceiling(rec)
    assert finding.severity == "warning"
    assert finding.title.startswith("The loop's waits put the input's cost at 84% of its time, but with its input")
    assert "Trust the measured figure, 57%" in finding.fix and "asynchronous device" in finding.fix


def test_waits_that_understate_the_input_say_loading_takes_from_the_step():
    rec = make_recording(ceiling=_ceiling(real_rate=10.0, free_rate=20.0, wait_share=0.05))
    finding = input_ceiling(rec)
    assert finding.severity == "warning" and "takes time from the step itself" in finding.fix


def test_input_bound_follows_the_measured_cost():
    # waits of 40 ms against a 50 ms step read as 44% waiting, but the data-free turns ran only 3% faster
    waiting = make_recording(wait_s=0.04, step_s=0.05)
    assert input_bound(waiting).severity == "critical"
    measured = make_recording(wait_s=0.04, step_s=0.05, ceiling=_ceiling(10.0, 10.3, 0.44))
    assert input_bound(measured) is None
    rules = [f.rule for f in diagnose(measured)]
    assert "input-bound" not in rules and "input-ceiling" in rules
    # and the other way round: few waits, but the input costs half the loop's time
    hidden = make_recording(wait_s=0.001, step_s=0.05, ceiling=_ceiling(10.0, 20.0, 0.02))
    finding = input_bound(hidden)
    assert finding.severity == "critical" and finding.evidence["measured_input_cost"] == pytest.approx(0.5)


def test_without_a_ceiling_nothing_is_said():
    assert input_ceiling(make_recording()) is None


def test_the_evidence_in_words():
    finding = input_ceiling(make_recording(ceiling=_ceiling(10.0, 16.0, 0.4)))
    words = evidence_words(finding.evidence)
    assert "measured cost of the input 37.5%" in words and "its cost as the waits say 40%" in words


def test_a_disagreement_that_one_pair_of_turns_does_not_show_is_no_warning():
    """Beside a busy neighbour one pair of turns may read the cost far from the rest: the waits are called wrong
    only when every pair says so, the same way."""
    ceiling = _ceiling(real_rate=10.0, free_rate=15.0, wait_share=0.08)  # measured 33%, waits 8%
    assert input_ceiling(make_recording(ceiling=ceiling)).severity == "warning"
    third = ceiling.turns[5]  # the third data-free turn ran as slowly as the real ones: that pair measured 0%
    third.seconds = third.intervals / 10.0
    finding = input_ceiling(make_recording(ceiling=ceiling))
    assert finding.evidence["measured_input_cost"] - finding.evidence["wait_model_input_cost"] > 0.10  # overall
    assert finding.severity == "info" and finding.evidence["turn_speedups"][-1] < 1.05


def test_the_jobs_ceiling_is_its_slowest_ranks_with_its_input_and_without():
    from loaderdoctor.rules.ceiling import job_ceiling

    ranks = {0: _ceiling(real_rate=10.0, free_rate=40.0, wait_share=0.7), 1: _ceiling(9.0, 30.0, 0.7)}
    finding = job_ceiling(ranks)
    assert finding.rule == "job-ceiling" and finding.severity == "info"
    assert finding.evidence["ceiling_speedup"] == pytest.approx(30.0 / 9.0, abs=1e-3)
    assert finding.evidence["input_cost_by_rank"] == {"0": 0.75, "1": 0.7}
    assert finding.title == (
        "With its input taken away the job (2 ranks) ran 3.33x as fast: the input costs 70% of its time "
        "(rank 0 75%, rank 1 70%)"
    )
    assert "measured cost of the input by rank 0: 75%" in evidence_words(finding.evidence)
    assert job_ceiling({0: ranks[0]}) is None  # one rank is no job to join


def test_joined_ranks_get_the_jobs_ceiling_on_the_lowest_rank():
    from loaderdoctor.job.loaders import LoaderRun
    from loaderdoctor.job.ranks import joined
    from loaderdoctor.report import LoaderReport

    def run(rank: int, free_rate: float) -> LoaderRun:
        rec = make_recording(ceiling=_ceiling(real_rate=10.0, free_rate=free_rate, wait_share=0.6))
        return LoaderRun(LoaderReport(f"train.py:9/rank{rank}", rec, [], None), "2026-11-27T00:00:00", {})

    runs = joined({0: [run(0, 25.0)], 1: [run(1, 20.0)]}, {0: "vm", 1: "vm"}, world_size=2)
    first, second = (r.report for r in runs)
    assert [f.rule for f in first.findings if f.rule == "job-ceiling"] == ["job-ceiling"]
    assert not [f for f in second.findings if f.rule == "job-ceiling"]
    (job,) = [f for f in first.findings if f.rule == "job-ceiling"]
    assert job.evidence["ceiling_batches_per_s"] == pytest.approx(20.0)


def test_batches_a_loop_left_unasked_beside_data_free_steps_are_said():
    """A loop that counts an epoch's batches (Lightning's, the Hugging Face Trainer's) ends the epoch after as many
    steps as the loader has batches: the data-free ones took the place of real ones, and the finding says so."""
    from loaderdoctor.recording.record import EpochRecord

    rec = make_recording(ceiling=_ceiling(real_rate=10.0, free_rate=16.0, wait_share=0.40))
    assert "unasked" not in input_ceiling(rec).fix
    per_epoch = rec.batches_per_epoch
    rec.epochs = [
        EpochRecord(0, 0.1, per_epoch - 9, 5.0, [], "left"),
        EpochRecord(1, 0.1, per_epoch, 5.0, [], "exhausted"),
    ]
    finding = input_ceiling(rec)
    assert finding.evidence["batches_left_unasked"] == 9
    assert "The loop left 9 of its epochs' batches unasked" in finding.fix
    assert "counts an epoch's batches itself" in finding.fix
    rec.ceiling.kept_length = "the loop's OneCycleLR is sized for 120 steps and raises past them"
    assert (
        "unasked: the loop's OneCycleLR is sized for 120 steps and raises past them, so each epoch with data-free "
        "steps kept its length." in input_ceiling(rec).fix
    )


def test_data_free_turns_no_faster_than_the_real_ones_promise_no_speedup():
    rec = make_recording(ceiling=_ceiling(real_rate=10.0, free_rate=9.7, wait_share=0.01))
    finding = input_ceiling(rec)
    assert "ran 0.97x as fast" in finding.title
    assert "would make this job no faster, and no more" in finding.fix and "0.97x faster" not in finding.fix
