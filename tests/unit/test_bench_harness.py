"""The benchmarks' harness (benchmarks/harness/): the order of rounds in turns, the median of per-round ratios, a
plain loop's count of batches, the tables as printed, and the results' JSON with the machine's facts, read back and
compared."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import harness
from harness import compare


def test_the_order_reverses_every_other_round_or_turns_by_one() -> None:
    names = ["a", "b", "c"]
    assert [harness.turn_order(names, n) for n in range(3)] == [names, ["c", "b", "a"], names]
    assert [harness.turn_order(names, n, "rotate") for n in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert harness.turn_order(names, 1, "same") == names


def test_rounds_in_turns_run_the_contenders_alternately_and_key_them_by_name() -> None:
    calls: list[str] = []

    def contender(name: str, figure: float):
        return lambda: calls.append(name) or figure

    rounds = list(harness.in_turns({"plain": contender("plain", 10.0), "other": contender("other", 9.0)}, 3))
    assert calls == ["plain", "other", "other", "plain", "plain", "other"]
    assert rounds == [{"plain": 10.0, "other": 9.0}] * 3
    assert all(list(r) == ["plain", "other"] for r in rounds)  # the contenders' order, whoever ran first


def test_the_ratio_is_the_median_of_per_round_ratios_not_the_ratio_of_medians() -> None:
    rounds = [
        {"base": 100.0, "x": 90.0},  # 0.90
        {"base": 40.0, "x": 50.0},  # 1.25: a slow round for both
        {"base": 100.0, "x": 120.0},  # 1.20
        {"base": 80.0, "x": None},  # not measured (a hang): no ratio
    ]
    assert harness.per_round_ratios(rounds, "x", "base") == [0.9, 1.25, 1.2]
    assert harness.median_ratio(rounds, "x", "base") == 1.2
    measured = rounds[:3]
    assert harness.median(r["x"] for r in measured) / harness.median(r["base"] for r in measured) == 0.9
    assert harness.median_ratio([{"base": None, "x": 1.0}], "x", "base") is None
    assert harness.median([]) is None


def test_a_plain_loop_counts_whole_epochs_after_its_warm_up() -> None:
    stepped: list[int] = []
    ended: list[bool] = []
    rate = harness.loop_rate([1, 2, 3], stepped.append, epochs=2, warm_up=1, end=lambda: ended.append(True))
    assert stepped == [1, 2, 3] * 3 and ended == [True]
    assert rate > 0


def test_the_ceiling_row_sets_the_tools_figures_beside_the_plain_loops() -> None:
    # the tool: a ceiling of 50 b/s and a cost of 60%; the plain loop: 20 b/s real, 40 b/s data-free (cost 50%)
    assert harness.ceiling_against_plain(50.0, 0.6, 20.0, 40.0) == pytest.approx([50.0, 40.0, 1.25, 60.0, 50.0, 10.0])
    assert harness.input_cost(45.0, 40.0) == 0.0  # a real loop faster than its data-free one costs nothing


def test_a_table_prints_its_header_rule_and_rows(capsys) -> None:
    table = harness.Table([harness.Column("pipeline", 10, align="<"), harness.Column("ratio", 7, ".2f", "x")])
    table.header()
    row = table.row("small", 1.234)
    table.row("hung", None, note="  (timed out)")
    assert capsys.readouterr().out.splitlines() == [
        "pipeline     ratio",
        "------------------",
        "small        1.23x",
        "hung             -  (timed out)",
    ]
    assert row == {"pipeline": "small", "ratio": 1.234}
    markdown = harness.Table([harness.Column("mode"), harness.Column("b/s", fmt=".1f", key="rate")], markdown=True)
    markdown.header()
    assert markdown.row("sleep", 49.44) == {"mode": "sleep", "rate": 49.44}
    assert capsys.readouterr().out.splitlines() == ["| mode | b/s |", "| --- | --- |", "| sleep | 49.4 |"]


def test_the_arguments_keep_each_benchmarks_names_for_its_rounds(tmp_path: Path) -> None:
    positional = harness.parser("A benchmark.\n\nUsage: ...", rounds=7, rounds_as="ROUNDS")
    assert positional.parse_args([]).rounds == 7
    assert positional.parse_args(["3", "--json", str(tmp_path / "r.json")]).rounds == 3
    assert harness.parser("B.", rounds=5).parse_args(["--rounds", "2"]).rounds == 2
    assert harness.parser("C.", rounds=3, rounds_as="--turns").parse_args(["--turns", "1"]).rounds == 1
    assert harness.parser("D.").parse_args([]).json is None


def test_the_results_json_loads_back_with_the_machines_facts(tmp_path: Path, capsys) -> None:
    path = tmp_path / "run" / "guard_overhead.json"
    args = argparse.Namespace(json=path, rounds=3, budget=20.0)
    with harness.Results("benchmarks/guard_overhead.py", args) as results:
        results.add(pipeline="no work", plain=100.0, guarded=98.0, ratio=0.98)
        results.figures["no work: guarded/plain"] = 0.98
    assert f"results: {path}" in capsys.readouterr().out
    kept = json.loads(path.read_text())
    assert kept["benchmark"] == "guard_overhead" and kept["rounds"] == 3
    assert kept["arguments"] == {"json": str(path), "rounds": 3, "budget": 20.0}
    assert kept["rows"] == [{"pipeline": "no work", "plain": 100.0, "guarded": 98.0, "ratio": 0.98}]
    assert kept["figures"] == {"no work: guarded/plain": 0.98}
    machine = kept["machine"]
    for fact in ("cpu_count", "cpu_model", "python_version", "torch_version", "loaderdoctor_version", "platform"):
        assert fact in machine
    assert machine["cpu_count"] >= 1 and machine["python_version"] and machine["loaderdoctor_version"]
    assert "load_avg_1m" in machine and len(machine["load_avg_at_end"]) == 3
    assert kept["started"] <= kept["ended"]


def test_results_without_json_write_nothing(tmp_path: Path) -> None:
    with harness.Results("x.py", argparse.Namespace(json=None)) as results:
        results.add(a=1)
    assert results.machine == {} and not list(tmp_path.iterdir())


def test_two_runs_compare_figure_by_figure(tmp_path: Path) -> None:
    for run, ratio in (("old", 0.98), ("new", 0.49)):
        (tmp_path / run).mkdir()
        kept = {"benchmark": "watch_overhead", "rounds": 7, "started": run, "machine": {"cpu_count": 2}}
        (tmp_path / run / "watch_overhead.json").write_text(json.dumps({**kept, "figures": {"watched/plain": ratio}}))
    shown = compare.lines(compare.load(tmp_path / "old"), compare.load(tmp_path / "new"))
    assert shown[0] == "== watch_overhead (rounds 7 / 7)"
    assert shown[1].startswith("   old: old; cpu_count 2")
    assert shown[3].split() == ["watched/plain", "0.980", "0.490", "0.500"]
