"""The CI gate of `loaderdoctor history compare --fail-if-slower PCT` (by run ids, or the newest run of a name
against the runs before it): its exit status, its last line and its JSON, on hand-made RunRecords saved to a
private history with the store's own API."""

from __future__ import annotations

import json

import pytest
from test_degradation import HOG, HOG_2, make_host, make_run

from loaderdoctor.cli import main
from loaderdoctor.history.compare import NAMED_SCHEMA, compare_runs, earlier_runs, judge, median_run
from loaderdoctor.history.store import load_runs, save_run


def _saved(*rates: float, name: str = "demo/train", **options) -> list[str]:
    """Runs of `name` at `rates`, oldest first, saved to the history; their ids as the command line takes them."""
    ids = []
    for rate in rates:
        minute = len(load_runs()) + 1  # started a minute apart, in the order given
        run = make_run(rate, run_id=minute, name=name, **options)
        run.id = None
        ids.append(str(save_run(run)))
    return ids


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_a_planted_slowdown_fails_the_gate_with_both_rates_and_the_threshold(capsys):
    (a,) = _saved(40.0)
    (b,) = _saved(10.0, host=make_host(other_processes=[HOG, HOG_2], load_avg_1m=2.4))
    assert main(["history", "compare", a, b, "--fail-if-slower", "10"]) == 1
    out = capsys.readouterr().out
    # the ranked changes as before, the side-by-side table, then the verdict last
    assert out.index("1. other processes took") < out.index("other processes  ") < out.index("gate: ")
    assert _last_line(out) == (
        "gate: slower: 40.0 -> 10.0 batches/s (-75%), beyond 10%; no spread of the runs' rate is known, so 10% "
        "alone decides: exit 1"
    )


def test_two_equal_runs_pass(capsys):
    a, b = _saved(40.0, 40.0)
    assert main(["history", "compare", a, b, "--fail-if-slower", "10"]) == 0
    assert _last_line(capsys.readouterr().out).startswith("gate: passed: 40.0 -> 40.0 batches/s (+0%), not slower;")


def test_a_drop_within_the_threshold_passes(capsys):
    a, b = _saved(40.0, 38.0)
    assert main(["history", "compare", a, b, "--fail-if-slower", "10"]) == 0
    assert "gate: passed: 40.0 -> 38.0 batches/s (-5%), within 10%;" in _last_line(capsys.readouterr().out)
    assert main(["history", "compare", a, b, "--fail-if-slower", "5"]) == 1  # the same drop, beyond 5%


def test_a_drop_beyond_the_threshold_within_the_runs_spread_passes_and_says_why(capsys):
    # The runs before the newest swung from 30 to 50 batches/s: a fall from their median of 40 to 30 is 25%,
    # beyond 10% but within that spread of 50%.
    _saved(30.0, 50.0, 40.0, 30.0)
    assert main(["history", "compare", "--name", "demo/train", "--fail-if-slower", "10"]) == 0
    out = capsys.readouterr().out
    assert "(run 3 is the median of the 3 runs before run 4: runs 3, 2, 1)" in out
    assert _last_line(out) == (
        "gate: passed: 40.0 -> 30.0 batches/s (-25%), beyond 10% but within the runs' spread of 50% (over 3 "
        "runs): exit 0"
    )


def test_a_drop_beyond_the_threshold_and_the_runs_spread_fails(capsys):
    _saved(38.0, 42.0, 40.0, 20.0)
    assert main(["history", "compare", "--name", "demo/train", "--fail-if-slower", "10"]) == 1
    assert _last_line(capsys.readouterr().out) == (
        "gate: slower: 40.0 -> 20.0 batches/s (-50%), beyond 10% and the runs' spread of 10% (over 3 runs): exit 1"
    )


def test_the_baseline_is_the_k_runs_before_the_newest(capsys):
    _saved(10.0, 40.0, 40.0, 30.0)  # the oldest run, slow, is left out with --baseline 2
    assert main(["history", "compare", "--name", "demo/train", "--baseline", "2", "--fail-if-slower", "10"]) == 1
    assert "beyond 10% and the runs' spread of 0% (over 2 runs): exit 1" in _last_line(capsys.readouterr().out)
    assert main(["history", "compare", "--name", "demo/train", "--baseline", "1", "--fail-if-slower", "10"]) == 1
    assert "no spread of the runs' rate is known" in _last_line(capsys.readouterr().out)


def test_each_loader_of_a_name_is_gated_and_the_slower_one_named(capsys):
    _saved(40.0, 39.2, name="demo/train")
    _saved(20.0, 5.0, name="demo/val")
    _saved(1.0, name="demo/test")  # one run: nothing to compare it with yet
    _saved(40.0, 1.0, name="demo-other/train")  # another name: not gated
    assert main(["history", "compare", "--name", "demo", "--fail-if-slower", "10"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-4].startswith("gate demo/train: passed: 40.0 -> 39.2 batches/s (-2%), within 10%")
    assert lines[-3].startswith("gate demo/val: slower: 20.0 -> 5.0 batches/s (-75%), beyond 10%")
    assert lines[-2] == "gate demo/test: no earlier run of it to compare with"
    assert lines[-1] == "gate: 1 of 3 loaders slower (demo/val): exit 1"


def test_the_json_carries_the_gates_verdict(capsys):
    a, b = _saved(40.0, 10.0)
    assert main(["history", "compare", a, b, "--fail-if-slower", "10", "--json"]) == 1
    gate = json.loads(capsys.readouterr().out)["gate"]
    assert gate == {
        "verdict": "slower",
        "failed": True,
        "threshold_pct": 10.0,
        "rate_a": 40.0,
        "rate_b": 10.0,
        "unit": "batches_per_s",
        "drop_pct": 75.0,
        "spread_pct": None,
        "spread_runs": 0,
        "spread_source": None,
    }
    _saved(20.0, 21.0, name="demo/val")
    assert main(["history", "compare", "--name", "demo", "--fail-if-slower", "10", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == NAMED_SCHEMA and document["failed"] == ["demo/train"]
    assert document["exit_status"] == 1
    verdicts = {c["b"]["name"]: c["gate"]["verdict"] for c in document["comparisons"]}
    assert verdicts == {"demo/train": "slower", "demo/val": "not-slower"}


def test_without_the_option_a_slower_run_still_exits_0(capsys):
    a, b = _saved(40.0, 10.0)
    assert main(["history", "compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "gate" not in out
    assert main(["history", "compare", a, b, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gate"] is None


@pytest.mark.parametrize("pct", ["abc", "0", "100", "-5", "nan", "inf", "150"])
def test_a_percent_out_of_range_is_a_usage_error(pct, capsys):
    a, b = _saved(40.0, 10.0)
    assert main(["history", "compare", a, b, "--fail-if-slower", pct]) == 2
    assert f"--fail-if-slower must be a percent between 0 and 100 (10 for 10%), not '{pct}'" in capsys.readouterr().err


def test_an_unknown_run_or_name_is_a_usage_error(capsys):
    a, _ = _saved(40.0, 10.0)
    assert main(["history", "compare", a, "999", "--fail-if-slower", "10"]) == 2
    assert "no run 999 in the history" in capsys.readouterr().err
    assert main(["history", "compare", "--name", "nobody", "--fail-if-slower", "10"]) == 2
    assert "no run named 'nobody' (nor nobody/...)" in capsys.readouterr().err
    assert main(["history", "compare", a, "--name", "demo/train"]) == 2  # ids or a name, not both
    assert main(["history", "--fail-if-slower", "10"]) == 2  # for compare only


def test_the_gate_judges_the_median_run_and_ranks_changes_against_the_runs_before():
    slowed = make_run(5.0, run_id=9, host=make_host(other_processes=[HOG, HOG_2], load_avg_1m=2.4))
    before = [make_run(rate, run_id=8 - i) for i, rate in enumerate((41.0, 39.0, 40.0, 12.0))]
    before.append(make_run(40.0, run_id=3, kind="check"))  # another kind: not compared
    baseline = earlier_runs(slowed, before)
    assert [run.id for run in baseline] == [8, 7, 6, 5]
    a = median_run(baseline)
    assert a.id == 7  # of 12, 39, 40, 41: the lower middle one
    comparison = compare_runs(a, slowed, baseline)
    assert comparison.changes[0].what == "other_processes"
    gate = judge(comparison, 0.1)
    assert gate.verdict == "slower" and gate.failed and comparison.gate is gate
    assert gate.spread == pytest.approx((41.0 - 12.0) / 39.0)
    assert gate.drop == pytest.approx(1 - 5.0 / 39.0)


def test_a_run_without_a_rate_gets_no_verdict_and_does_not_fail(capsys):
    (a,) = _saved(40.0)
    no_rate = make_run(10.0)
    no_rate.measurements = {"outcome": "stalled"}
    c = str(save_run(no_rate))
    assert main(["history", "compare", a, c, "--fail-if-slower", "10"]) == 0
    assert _last_line(capsys.readouterr().out) == (
        "gate: no verdict: one of the runs measured no rate to compare: exit 0"
    )


def test_the_first_run_of_a_name_has_nothing_to_compare_with_and_passes(capsys):
    _saved(40.0)
    assert main(["history", "compare", "--name", "demo", "--fail-if-slower", "10"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [
        "demo/train: no earlier run of it to compare with",
        "gate: no earlier run to compare with yet: exit 0",
    ]


def _saved_with_own_spread(rate: float, low: float, high: float) -> str:
    run = make_run(rate, run_id=len(load_runs()) + 1, name="demo/train")
    run.measurements["batches_per_s_range"] = [low, high]  # its rate over three stretches of its steady batches
    run.id = None
    return str(save_run(run))


def test_two_runs_each_with_its_own_spread_are_judged_by_the_wider(capsys):
    a = _saved_with_own_spread(40.0, 30.0, 50.0)  # a run whose rate moved by half while measured
    b = _saved_with_own_spread(30.0, 29.0, 31.0)
    assert main(["history", "compare", a, b, "--fail-if-slower", "10"]) == 0
    assert "within the runs' spread of 50% (within each run): exit 0" in _last_line(capsys.readouterr().out)
    c = _saved_with_own_spread(40.0, 39.0, 41.0)
    d = _saved_with_own_spread(20.0, 19.5, 20.5)  # half the rate, each run steady to 5%
    assert main(["history", "compare", c, d, "--fail-if-slower", "10"]) == 1
    assert "beyond 10% and the runs' spread of 5% (within each run): exit 1" in _last_line(capsys.readouterr().out)
