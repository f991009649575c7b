"""An epoch's time and cost, now and with the verified fix."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from recordings import make_recording

from loaderdoctor.recording.epochcost import EpochCost, epoch_cost


def test_an_epoch_now_and_with_the_fix_in_time_and_money():
    cost = EpochCost(batches=18_968, batches_per_s=2.09, fixed_batches_per_s=4.05, cost_per_hour=32.0)
    assert cost.epoch_s == pytest.approx(18_968 / 2.09)
    assert cost.fixed_epoch_s == pytest.approx(18_968 / 4.05)
    assert cost.saved_per_epoch == pytest.approx(32.0 * (18_968 / 2.09 - 18_968 / 4.05) / 3600)
    assert cost.words() == (
        "an epoch of 18,968 batches: 2 h 31 min now, 1 h 18 min with the fix; "
        "$80.67 per epoch, $39.04 saved with the fix"
    )
    data = cost.to_dict()
    assert data["batches"] == 18_968 and data["saved_per_epoch"] == pytest.approx(39.04, abs=0.01)


def test_without_a_price_or_a_fix_only_the_time_now():
    cost = EpochCost(batches=100, batches_per_s=10.0, fixed_batches_per_s=None, cost_per_hour=None)
    assert cost.words() == "an epoch of 100 batches: 10 s now"
    assert cost.to_dict()["cost_per_epoch"] is None and cost.to_dict()["fixed_epoch_s"] is None


def test_from_a_report_the_verified_rates_and_the_loaders_length():
    rec = make_recording()
    helped = SimpleNamespace(before=10.0, after=25.0, helped=True, speedup=2.5, unsteady=False, spread=(2.4, 2.6))
    cost = epoch_cost(SimpleNamespace(recording=rec, verification=helped), None, 6.0)
    assert cost is not None
    assert cost.batches == rec.batches_per_epoch
    assert (cost.batches_per_s, cost.fixed_batches_per_s) == (10.0, 25.0)
    assert cost.fixed_speedup_range is None and cost.fixed_epoch_s == pytest.approx(cost.batches / 25.0)
    slower = SimpleNamespace(before=10.0, after=8.0, helped=False, speedup=0.8, unsteady=False, spread=(0.7, 0.9))
    cost = epoch_cost(SimpleNamespace(recording=rec, verification=slower), 500, None)
    assert cost is not None and cost.batches == 500 and cost.fixed_batches_per_s is None


def test_a_fix_measured_unsteadily_under_load_gives_a_range_of_epoch_times_not_one():
    rec = make_recording()
    unsteady = SimpleNamespace(before=10.0, after=25.0, helped=True, speedup=2.5, unsteady=True, spread=(1.6, 4.0))
    cost = epoch_cost(SimpleNamespace(recording=rec, verification=unsteady), 100, 36.0)
    assert cost is not None and cost.fixed_speedup_range == (1.6, 4.0)
    assert cost.fixed_epoch_s is None and cost.saved_per_epoch is None
    assert cost.fixed_epoch_range_s == pytest.approx((10.0 / 4.0, 10.0 / 1.6))
    assert cost.words() == (
        "an epoch of 100 batches: 10 s now, 2 s to 6 s with the fix (the machine's load moved its measurement "
        "too much for one figure); $0.10 per epoch"
    )
    data = json.loads(json.dumps(cost.to_dict()))
    assert data["fixed_epoch_s"] is None and data["fixed_epoch_s_range"] == pytest.approx([2.5, 6.25])
    assert EpochCost.from_dict(data) == cost
