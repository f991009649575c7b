"""A finding's evidence in words: a label and unit for each key the rules write, from one table; a key the table
does not know is said by its name, its unit read from its ending."""

from __future__ import annotations

import ast
from pathlib import Path

import loaderdoctor
from loaderdoctor.render.evidence import LABELS, evidence_words


def test_known_keys_are_said_with_their_labels_and_units():
    evidence = {"wait_ms_mean": 12.34, "num_workers": 4, "wait_fraction": 0.628, "usable_cores": 1.0}
    assert evidence_words(evidence) == "wait per batch 12.3 ms, workers 4, waiting for data 62.8%, usable 1 core"


def test_values_are_said_in_words():
    assert evidence_words({"pin_memory": False, "loading_cores": None}) == "pinned memory no, loading used unknown"
    assert evidence_words({"first_batch_s": [0.07, 0.125]}) == "first batch per epoch 0.07, 0.125 s"
    assert evidence_words({"indices": list(range(9))}) == "sample indices 0, 1, 2, 3, 4, 5, … 3 more"
    assert evidence_words({"wait_ms_by_rank": {"0": 12.0, "1": 50.5}}) == "wait per batch by rank 0: 12 ms; 1: 50.5 ms"
    assert evidence_words({"ratio": 0.625, "cpu_percent": 150.0}) == "ratio to the baseline 0.625x, CPU 150%"


def test_the_records_a_degradation_compares_are_said_in_words_not_dumped():
    evidence = {
        "compared_runs": [{"id": 10, "started_at": "2026-05-01T10:10:00.000+00:00", "rate": 20.8}],
        "changes": [{"what": "other_processes", "before": 0.0, "now": 1.92, "words": "other processes took 1.9 cores"}],
        "named_processes": [
            {"pid": 4242, "cmdline": "python", "cores": 0.97, "stray": False, "same_user": False},
            {"pid": 5151, "cmdline": "python", "cores": 0.9, "stray": True},
        ],
    }
    assert evidence_words(evidence) == (
        "runs compared run 10 of 2026-05-01 10:10 at 20.8, changes other processes took 1.9 cores, processes named "
        "pid 4242 python (0.97 cores, another user's); pid 5151 python (0.9 cores, a stray worker)"
    )


def test_unknown_keys_fall_back_to_their_words_and_the_unit_of_their_ending():
    evidence = {"shm_spill_ms": 3.5, "waiting_share_at_2_ranks": 0.5, "new_thing": "x", "cold_start_s": 2}
    assert evidence_words(evidence) == "shm spill 3.5 ms, waiting share at 2 ranks 50%, new thing x, cold start 2 s"


def _names_evidence(target: ast.expr) -> bool:
    """Whether an assignment's target is `evidence[...]`."""
    return isinstance(target, ast.Subscript) and getattr(target.value, "id", "") == "evidence"


def _evidence_keys(tree: ast.AST) -> set[str]:
    """The string keys of the evidence dicts a module writes: `evidence={...}`, `evidence = {...}`,
    `evidence["k"] = ...`, `evidence.update({...})` and the dicts of its `*_evidence()` helpers."""
    keys: set[str] = set()

    def literal_keys(node: ast.AST | None) -> None:
        if isinstance(node, ast.Dict):
            keys.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "evidence":
            literal_keys(node.value)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "evidence":
                literal_keys(node.value)
            elif _names_evidence(target) and isinstance(target.slice, ast.Constant):
                keys.add(target.slice.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update":
            if getattr(node.func.value, "id", "") == "evidence":
                for argument in node.args:
                    literal_keys(argument)
                keys.update(kw.arg for kw in node.keywords if kw.arg)
        elif isinstance(node, ast.FunctionDef) and node.name.endswith("_evidence"):
            for inner in ast.walk(node):
                literal_keys(inner)
    return keys


def test_every_evidence_key_the_package_writes_has_a_label():
    package = Path(loaderdoctor.__file__).parent
    written = set()
    for path in package.rglob("*.py"):
        written |= _evidence_keys(ast.parse(path.read_text()))
    assert {"wait_fraction", "num_workers", "shared_samples_share", "rss_mb"} <= written  # the scan finds them
    assert sorted(written - set(LABELS)) == []
