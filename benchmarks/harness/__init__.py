"""The benchmarks' harness: their arguments (`--json PATH` among them), a plain loop's rate, rounds in turns and
the median of per-round ratios, the tables they print, and their results as JSON with the machine's facts.

timing.py measures, fresh.py runs what a benchmark measures in fresh processes, results.py prints and keeps,
shared_datasets.py holds the datasets several benchmarks use, ranks.py the plain side of the two-rank benchmarks,
and compare.py sets two runs' JSON side by side. The scripts run as `python benchmarks/NAME.py`, which puts
benchmarks/ first on sys.path: `import harness` finds this folder."""

from harness.fresh import check_json, figure_in_fresh_process, run_json, script_folder
from harness.results import CEILING_COLUMNS, Column, OverheadTable, Results, Table, machine_facts, parser, shown
from harness.timing import (
    calibrated_passes,
    ceiling_against_plain,
    in_turns,
    input_cost,
    loop_rate,
    median,
    median_ratio,
    per_round_ratios,
    side_by_side,
    turn_order,
)

__all__ = [
    "CEILING_COLUMNS",
    "Column",
    "OverheadTable",
    "Results",
    "Table",
    "calibrated_passes",
    "ceiling_against_plain",
    "check_json",
    "figure_in_fresh_process",
    "in_turns",
    "input_cost",
    "loop_rate",
    "machine_facts",
    "median",
    "median_ratio",
    "parser",
    "per_round_ratios",
    "run_json",
    "script_folder",
    "shown",
    "side_by_side",
    "turn_order",
]
