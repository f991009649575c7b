"""verify: the verdict on a fix from windows measured in turns (hand-made recordings), and the turns themselves
on loaders in this process (fast, no workers)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from recordings import make_recording
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.probe.measuring import Measuring
from loaderdoctor.probe.verdict import compare, decide
from loaderdoctor.probe.verify import fix_kind, verify
from loaderdoctor.recording.record import Recording, Window
from loaderdoctor.report import Finding

ORIGINAL = Settings()
FIX = Settings(num_workers=2, persistent_workers=True)


def _windowed(rec: Recording, pieces: int, slow: dict[int, float] | None = None) -> Recording:
    """`rec` measured in `pieces` windows of equal batches; window i's waits multiplied by slow[i]."""
    batches = rec.batches
    per = len(batches) // pieces
    rec.windows = []
    for i in range(pieces):
        part = batches[i * per : (i + 1) * per]
        for batch in part:
            batch.wait_s *= (slow or {}).get(i, 1.0)
        rec.windows.append(Window(part[0].delivered_s, part[-1].delivered_s))
    return rec


def _run(wait_s: float, *, pieces: int = 6, slow: dict[int, float] | None = None, **fields) -> Recording:
    settings = fields.pop("settings", ORIGINAL)
    rec = make_recording(
        settings=settings, epochs=1, batches_per_epoch=60, wait_s=wait_s, step_s=0.02, first_batch_s=0.1, **fields
    )
    return _windowed(rec, pieces, slow)


def _finding(rule: str) -> Finding:
    return Finding(rule, "warning", rule, {}, "", settings_change={"num_workers": 2})


def test_a_fix_faster_in_every_pair_is_faster():
    v = compare(_run(0.03), _run(0.005, settings=FIX), "speed")
    assert v.verdict == "faster" and v.helped
    assert v.speedup == pytest.approx(0.05 / 0.025, rel=0.02)
    assert v.pairs == 6
    assert v.spread[0] == pytest.approx(2.0, rel=0.05) and v.spread[1] == pytest.approx(2.0, rel=0.05)
    assert v.note.startswith("2.00x faster (6 pairs of windows, 2.00x to 2.00x)")


def test_one_disturbed_pair_does_not_flip_the_verdict():
    # Another process took a core during one window of the fix: that pair shows it slower.
    v = compare(_run(0.03), _run(0.005, settings=FIX, slow={2: 20.0}), "speed")
    assert v.spread[0] < 1.0 < v.spread[1]
    assert v.verdict == "faster"


def test_pairs_measured_while_other_processes_took_cores_are_left_out(monkeypatch):
    """A job that came and went slowed the original settings (a process of two threads) more than the fix in
    windows 1 and 3: those pairs show 3x where the machine as it usually is gives 2x. They are said, and left
    out; with no quiet pairs to spare (busy throughout), every pair counts."""
    busy_windows = {1, 3}
    before = _run(0.03, slow={1: 3.0, 3: 3.0})  # 50 ms a batch becomes 110 ms
    after = _run(0.005, settings=FIX, slow={1: 2.6, 3: 2.6})  # 25 ms becomes 33 ms
    loads = {id(w): 1.0 if i in busy_windows else 0.05 for rec in (before, after) for i, w in enumerate(rec.windows)}
    monkeypatch.setattr("loaderdoctor.probe.verdict.other_cores", lambda rec, window=None: loads.get(id(window)))
    v = compare(before, after, "speed")
    assert v.verdict == "faster"
    assert v.speedup == pytest.approx(2.0, rel=0.02) and v.pairs == 4 and v.busy_pairs == 2
    assert v.before == pytest.approx(20.0, rel=0.02)  # the quiet windows' rate: 1 / 50 ms
    assert "2 more pairs measured while other processes took up to 1.0 cores (3.33x to 3.33x) left out" in v.note
    assert v.to_dict()["busy_window_pairs"] == 2
    busy_windows.update(range(6))
    loads.update({id(w): 1.0 for rec in (before, after) for w in rec.windows})
    everywhere = compare(before, after, "speed")
    assert everywhere.pairs == 6 and everywhere.busy_pairs == 0 and everywhere.speedup > 2.2
    # Busy throughout, its pairs 2x to 3.3x: the load moved them more than one figure allows (see the next test).
    assert everywhere.under_load and everywhere.to_dict()["under_load"] is True and everywhere.unsteady
    assert "could not be measured fairly: other processes took 1.0 cores throughout" in everywhere.note
    assert not v.under_load and "quiet machine" not in v.note


def test_pairs_that_differ_too_much_under_load_give_a_range_and_say_no_figure_is_fair(monkeypatch):
    """Busy throughout, and the load moved the original's rate between windows (a process whose threads wait on
    each other, beside a hog): pairs from 2x to 5x. Faster in every pair; by how much is not one figure."""
    before = _run(0.03, slow={1: 3.0, 3: 3.0, 5: 2.0})
    after = _run(0.005, settings=FIX)
    monkeypatch.setattr("loaderdoctor.probe.verdict.other_cores", lambda rec, window=None: 1.0)
    v = compare(before, after, "speed")
    assert v.verdict == "faster" and v.helped and v.under_load and v.unsteady
    assert v.spread[1] > 1.5 * v.spread[0]
    assert v.note.startswith("faster (6 pairs of windows, 2.00x to 4.40x), but by how much could not be measured")
    assert "other processes took 1.0 cores throughout" in v.note and f"{v.speedup:.2f}x faster" not in v.note
    assert v.to_dict()["unsteady"] is True

    steady = compare(_run(0.03, slow={1: 1.2}), _run(0.005, settings=FIX), "speed")  # busy, but pairs agree
    assert steady.under_load and not steady.unsteady
    # Measured fairly (in turns, under the same load), and said to be the machine's under it.
    assert "every pair was measured while other processes took 1.0 cores" in steady.note
    assert "can differ from a quiet machine's" in steady.note


def test_not_a_fix_only_when_slower_in_every_pair():
    v = compare(_run(0.01), _run(0.015, settings=FIX), "speed")
    assert v.verdict == "slower" and not v.helped
    assert "slower in every pair of windows" in v.note
    mixed = compare(_run(0.01), _run(0.015, settings=FIX, slow={0: 0.1}), "speed")
    assert mixed.verdict == "no-gain"  # one pair shows it faster: within the noise, not "not a fix"
    assert "no measurable gain" in mixed.note and not mixed.helped


def test_a_small_gain_is_no_gain():
    v = compare(_run(0.01), _run(0.009, settings=FIX), "speed")  # 30 ms against 29 ms a batch
    assert v.verdict == "no-gain"


def test_safety_and_cost_fixes_need_only_be_as_fast():
    assert compare(_run(0.01), _run(0.0101, settings=FIX, slow={1: 0.5}), "safety").verdict == "as-fast"
    four = Settings(num_workers=4, persistent_workers=True)
    cost = compare(_run(0.01, settings=four), _run(0.0101, settings=FIX, slow={1: 0.5}), "cost")
    assert cost.verdict == "as-fast" and "fewer processes" in cost.note
    assert compare(_run(0.01), _run(0.02, settings=FIX), "safety").verdict == "slower"


def test_a_cost_fix_that_runs_as_many_workers_and_busy_threads_saves_nothing():
    # Issue 49: worker_threads=1 where each worker computed on one thread already (torch sets it in every worker):
    # "as fast with fewer processes or threads", though none were fewer.
    same = dataclasses.replace(FIX, worker_threads=1)
    v = compare(_run(0.01, settings=FIX), _run(0.0101, settings=same, slow={1: 0.5}), "cost")
    assert v.verdict == "no-gain" and not v.helped
    assert "fewer processes" not in v.note


def test_as_fast_under_load_with_pairs_too_unsteady_for_a_figure_verifies_nothing(monkeypatch):
    # Issue 49's OpenCV pipeline beside hogs: pairs from 0.6x to 1.4x, "no clear difference", headed "verified fix".
    from loaderdoctor.render.console import verification_head

    monkeypatch.setattr("loaderdoctor.probe.verdict.other_cores", lambda rec, window=None: 1.0)
    v = compare(_run(0.01), _run(0.01, settings=FIX, slow={1: 1.8, 3: 0.4}), "safety")
    assert v.unsteady and v.verdict == "no-gain" and not v.helped
    assert v.note.startswith("no clear difference (6 pairs of windows")
    assert verification_head(ORIGINAL, v)[0] != "verified fix"


def test_a_run_cut_short_is_not_measured_and_has_no_ratio():
    v = compare(_run(0.03, pieces=1), _run(0.005, settings=FIX, pieces=1), "speed")
    assert v.verdict == "not-measured"
    assert v.speedup is None
    assert v.to_dict()["speedup"] is None
    assert v.to_dict()["after_outcome"] == "cut-short"
    assert "give a larger --budget" in v.note


def test_a_fix_that_repeats_the_stream_is_other_data():
    before, after = _run(0.03), _run(0.005, settings=FIX)
    for epoch in after.epochs:
        epoch.typical_copies = 2
    v = compare(before, after, "speed")
    assert v.verdict == "other-data" and v.speedup is None
    assert "every sample came 2 times" in v.note


def test_a_fix_whose_epochs_differ_in_length_is_other_data():
    before, after = _run(0.03), _run(0.005, settings=FIX)
    after.epochs[0].batches = 120
    assert compare(before, after, "speed").verdict == "other-data"


def test_a_fix_that_stalls_failed():
    v = compare(_run(0.03), _run(0.005, settings=FIX, outcome="stalled"), "speed")
    assert v.verdict == "failed" and v.speedup is None


@pytest.mark.parametrize(
    ("speedup", "ratios", "verdict"),
    [
        (1.5, [1.4, 1.6, 1.5, 0.9], "faster"),  # three pairs in four agree
        (1.5, [1.4, 0.9, 0.9, 1.6], "no-gain"),  # half: not enough
        (1.05, [1.04, 1.06], "no-gain"),
        (0.8, [0.7, 0.9, 0.8], "slower"),
        (0.8, [0.7, 1.01, 0.8], "no-gain"),
        (0.998, [0.9993, 0.9985], "no-gain"),  # every pair a hair slower: noise, not a slower fix
    ],
)
def test_decide(speedup, ratios, verdict):
    assert decide(speedup, ratios, "speed") == verdict


def test_what_a_fix_is_for():
    assert fix_kind([_finding("fork-unsafe")]) == "safety"
    assert fix_kind([_finding("cpu-oversubscription")]) == "cost"
    assert fix_kind([_finding("cpu-oversubscription"), _finding("shm-capacity")]) == "cost"
    assert fix_kind([_finding("input-bound"), _finding("fork-unsafe")]) == "speed"


# verify() itself, on loaders in this process


class Sleepy(Dataset):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.seconds)
        return torch.tensor([index])


def test_the_original_and_the_fix_take_turns_for_equal_time():
    spec = LoaderSpec.from_loader(DataLoader(Sleepy(0.004), batch_size=2))
    before = make_recording(settings=ORIGINAL)
    fix = Settings(prefetch_factor=None, pin_memory=False)  # the same loader: no difference to find
    (v,) = verify(Measuring(spec), before, [_finding("input-bound")], [fix], budget_s=5.0)
    original = v.after_recording  # the fix's recording; both ran the same rounds
    assert v.pairs >= 2
    assert v.verdict == "no-gain"
    assert 0.5 < v.spread[0] <= v.spread[1] < 2.0
    assert len(original.windows) == v.pairs
    assert all(w.ended_s - w.started_s < 2.0 for w in original.windows)
    assert v.before_startup_s is not None and v.after_startup_s is not None


def test_a_fix_for_a_loader_that_stalled_is_measured_alone():
    spec = LoaderSpec.from_loader(DataLoader(Sleepy(0.001), batch_size=2))
    before = make_recording(settings=ORIGINAL, outcome="stalled")
    (v,) = verify(Measuring(spec), before, [_finding("input-bound")], [ORIGINAL], budget_s=1.0)
    assert v.verdict == "rescued" and v.helped
    assert v.speedup is None
    assert "where the original settings stalled" in v.note


def test_a_fix_that_starts_far_sooner_and_runs_as_fast_helps():
    before, after = _run(0.01), _run(0.0101, settings=FIX, slow={1: 0.5})
    before.epochs[0].first_batch_s = 6.7  # a large dataset unpickled by each spawned worker
    after.epochs[0].first_batch_s = 0.05
    v = compare(before, after, "speed")
    assert v.verdict == "quicker-start" and v.helped
    assert v.note.startswith("starts in 0.05 s instead of 6.70 s, once per run, and runs as fast (1.03x;")
    after.epochs[0].first_batch_s = 6.0  # 0.7 s sooner: not enough to count
    assert compare(before, after, "speed").verdict == "no-gain"


def test_a_fix_that_starts_far_sooner_but_runs_slower_says_both():
    before, after = _run(0.01), _run(0.02, settings=FIX)
    before.epochs[0].first_batch_s = 6.7
    after.epochs[0].first_batch_s = 0.05
    v = compare(before, after, "speed")
    assert v.verdict == "slower" and not v.helped
    assert v.note.startswith("starts in 0.05 s instead of 6.70 s, once per run, but then runs slower in every pair")


def test_with_a_step_the_loops_ceiling_is_measured_in_the_same_rounds():
    """The step on one batch, again and again, beside the windows: 2 ms a step against 8 ms of loading a batch,
    so the loop with its input taken away runs several times faster, and each rate is a share of that."""
    spec = LoaderSpec.from_loader(DataLoader(Sleepy(0.004), batch_size=2))
    steps: list[torch.Tensor] = []

    def step(batch: torch.Tensor) -> None:
        steps.append(batch)
        time.sleep(0.002)

    before = make_recording(settings=ORIGINAL)
    fix = Settings(prefetch_factor=None, pin_memory=False)
    (v,) = verify(Measuring(spec, step=step), before, [_finding("input-bound")], [fix], budget_s=5.0)
    assert v.ceiling is not None and v.ceiling_windows >= v.pairs >= 2
    assert v.ceiling > 3 * v.after  # about 5x: (8 + 2) ms a batch against 2 ms
    assert v.ceiling < 1 / 0.002  # no faster than the step allows
    assert v.share_of_ceiling(v.after) < 0.35 and v.share_of_ceiling(v.before) < 0.35
    written = v.to_dict()
    assert written["ceiling_batches_per_s"] == pytest.approx(v.ceiling, rel=1e-3)
    assert written["share_of_ceiling"] == pytest.approx(v.after / v.ceiling, abs=1e-3)
    back = type(v).from_dict(written)
    assert back.ceiling == pytest.approx(v.ceiling, rel=1e-3) and back.ceiling_windows == v.ceiling_windows


def test_without_a_step_there_is_no_ceiling_to_measure():
    spec = LoaderSpec.from_loader(DataLoader(Sleepy(0.002), batch_size=2))
    before = make_recording(settings=ORIGINAL)
    (v,) = verify(Measuring(spec), before, [_finding("input-bound")], [ORIGINAL], budget_s=2.0)
    assert v.ceiling is None and v.to_dict()["share_of_ceiling"] is None
