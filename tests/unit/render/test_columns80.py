"""Tables and evidence readable at 80 columns (issue 35): `history`, `scenarios`, `tune` and `scale` print at 80
columns without a line past the width or a word broken over two lines, and keep their wide tables at 120; code
pastes as printed at 60, 80 and 120 columns."""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from recordings import make_host, make_recording
from rich.console import Console

from loaderdoctor import scenarios
from loaderdoctor.commands import scenarios as scenarios_command
from loaderdoctor.history.records import run_record
from loaderdoctor.history.store import FILE_NAME, load_runs
from loaderdoctor.loader.settings import Settings
from loaderdoctor.render import console as check_render
from loaderdoctor.render import scale as scale_render
from loaderdoctor.render import tune as tune_render
from loaderdoctor.render.history import render_run, render_runs
from loaderdoctor.render.scale import rank_words
from loaderdoctor.report import LoaderReport, Report
from loaderdoctor.rules import diagnose
from loaderdoctor.saved import read_report

SAVED = Path(__file__).parents[1] / "saved"
NOW = "2026-11-27T10:00:00+00:00"


def _printed(draw, width: int) -> list[str]:
    """What `draw(console)` prints on a console `width` columns wide, line by line."""
    console = Console(record=True, width=width, file=io.StringIO())
    draw(console)
    return console.export_text().splitlines()


def _one_line_holding(lines: list[str], words: str) -> str:
    """The line that holds `words` whole (spaces in it as printed)."""
    found = [line for line in lines if words in line]
    assert found, f"{words!r} is on no line whole:\n" + "\n".join(lines)
    return found[0]


# --- history ----------------------------------------------------------------------------------------------------


def _history_runs(tmp_path, monkeypatch) -> list[dict]:
    """The saved history's run and runs of the house's recordings, with real findings: a respawning loader (the
    issue's 'worker-respaw / n'), a starved one, a healthy one; newest first."""
    monkeypatch.setenv("LOADERDOCTOR_HOME", str(tmp_path))
    shutil.copy(SAVED / "history-a8c0f6b.sqlite3", tmp_path / FILE_NAME)
    (saved,) = load_runs()
    recordings = {
        "train.py:42#2": make_recording(
            settings=Settings(num_workers=2), start_method="spawn", epochs=3, first_batch_s=1.5, batches_per_epoch=6
        ),
        "imagenet/val": make_recording(settings=Settings(num_workers=0), wait_s=0.08, step_s=0.02),
        "bert": make_recording(),
    }
    runs = [saved.to_dict()]
    for number, (name, rec) in enumerate(recordings.items(), start=2):
        report = LoaderReport(name, rec, diagnose(rec))
        record = run_record("check", name, report, NOW, NOW, {"cpu_count": 2}, "train.py").to_dict()
        runs.append({**record, "id": number})
    return runs[::-1]


def _says(line: str, rule: str, title: str) -> bool:
    """Whether `line` says the finding: its rule whole, then its title whole or cut at a word with an ellipsis (never
    a piece of a word carried to the next line)."""
    if f"{rule}: " not in line:
        return False
    said = re.sub(r" \(\+\d+\)$", "", line.split(f"{rule}: ", 1)[1])
    return said == title or (said.endswith("…") and (title + " ").startswith(said[:-1] + " "))


def _main_findings(runs: list[dict]) -> list[tuple[str, str]]:
    return [(run["findings"][0]["rule"], run["findings"][0]["title"]) for run in runs if run["findings"]]


def test_history_at_80_columns_breaks_no_name_rule_or_title_and_passes_no_line_past_the_width(tmp_path, monkeypatch):
    runs = _history_runs(tmp_path, monkeypatch)
    assert {"worker-respawn", "input-bound"} <= {rule for rule, _ in _main_findings(runs)}
    lines = _printed(lambda console: render_runs(runs, "/h", None, console), 80)
    assert max(len(line) for line in lines) <= 80
    for run in runs:
        row = _one_line_holding(lines, f" {run['name']} ")
        assert row.split()[2] == str(run["id"])  # a row of its own, under the table's header
    for rule, title in _main_findings(runs):
        assert any(_says(line, rule, title) for line in lines), (rule, title, lines)
    assert "when" in lines[0] and "main finding" not in lines[0]  # the main finding takes a line of its own


def test_history_at_120_columns_keeps_the_table_of_one_line_per_run(tmp_path, monkeypatch):
    runs = _history_runs(tmp_path, monkeypatch)
    lines = _printed(lambda console: render_runs(runs, "/h", None, console), 120)
    assert lines[0].split() == ["when", "id", "name", "kind", "settings", "batches/s", "waiting", "main", "finding"]
    assert len(lines) == len(runs) + 2  # the header, a line per run, the count
    for run, row in zip(runs, lines[1:], strict=False):
        assert f" {run['name']} " in row
        main = run["findings"][0]["rule"] + ": " if run["findings"] else "none"
        assert main in row


def test_history_too_narrow_for_its_row_gives_a_record_per_run(tmp_path, monkeypatch):
    runs = _history_runs(tmp_path, monkeypatch)
    lines = _printed(lambda console: render_runs(runs, "/h", None, console), 60)
    assert max(len(line) for line in lines if "newest first" not in line) <= 60
    for run in runs:
        assert _one_line_holding(lines, f"{run['id']}  {run['name']}  check,")
    for rule, _ in _main_findings(runs):
        _one_line_holding(lines, f"    {rule}: ")


# --- scenarios ---------------------------------------------------------------------------------------------------


def _scenarios(width: int) -> list[str]:
    return _printed(lambda console: scenarios_command.run(argparse.Namespace(), console, console), width)


def test_scenarios_at_80_columns_name_each_over_its_summary_in_a_few_whole_lines():
    lines = _scenarios(80)
    assert max(len(line) for line in lines) <= 80
    for scenario in scenarios.all_scenarios():
        at = next(i for i, line in enumerate(lines) if line.startswith(f"scenario:{scenario.name} "))
        assert (scenario.planted_cause or "none") in lines[at]
        summary = []
        for line in lines[at + 1 :]:
            if not line.startswith("    "):
                break
            summary.append(line.strip())
        assert " ".join(summary) == " ".join(scenario.summary.split())  # every word whole, in order
        assert len(summary) <= 3  # not the 6-line cells of a squeezed column


def test_scenarios_at_200_columns_are_one_table_row_each():
    lines = _scenarios(200)
    assert lines[0].split() == ["scenario", "what", "it", "is", "planted", "cause"]
    for scenario in scenarios.all_scenarios():
        row = _one_line_holding(lines, f"scenario:{scenario.name} ")
        assert " ".join(scenario.summary.split()) in " ".join(row.split())


# --- tune and scale ----------------------------------------------------------------------------------------------


def _code_lines(*snippets: str) -> set[str]:
    return {line.strip() for snippet in snippets for line in snippet.splitlines()}


def test_tune_at_80_columns_prints_each_trial_whole_and_at_120_one_row_each():
    report = read_report(SAVED / "tune-a0702f8.json")
    (tuning,) = report.loaders.values()
    code = _code_lines(tuning.chosen.settings.snippet())
    narrow = _printed(lambda console: tune_render.render(report, console), 80)
    assert max(len(line) for line in narrow if line.strip() not in code) <= 80
    wide = _printed(lambda console: tune_render.render(report, console), 120)
    for trial in tuning.trials:
        settings = trial.settings.describe()
        _one_line_holding(narrow, settings)  # on a line of its own under the trial's figures
        row = _one_line_holding(wide, settings)
        assert f"{trial.batches_per_s:.1f}" in row and row.split()[0] == str(trial.number)


def test_scale_at_80_columns_gives_each_rank_a_whole_line_and_at_120_puts_them_side_by_side():
    report = read_report(SAVED / "scale-a0702f8.json")
    code = _code_lines(*(f.snippet or "" for lr in report.loaders.values() for f in lr.findings))
    narrow = _printed(lambda console: scale_render.render(report, console), 80)
    wide = _printed(lambda console: scale_render.render(report, console), 120)
    assert max(len(line) for line in narrow if line.strip() not in code) <= 80
    for lr in report.loaders.values():
        for run in lr.runs:
            words = [rank_words(f) for f in run.per_rank]
            for each in words:
                _one_line_holding(narrow, each)
            assert _one_line_holding(wide, "  ".join(words))


# --- evidence ----------------------------------------------------------------------------------------------------


def test_a_findings_evidence_prints_in_words_while_its_json_keeps_key_and_value():
    rec = make_recording(settings=Settings(num_workers=0), wait_s=0.08, step_s=0.02, host=make_host())
    findings = diagnose(rec)
    report = Report("train.py", {"train": LoaderReport("train", rec, findings, None)})
    lines = _printed(lambda console: check_render.render(report, console), 80)
    text = " ".join(" ".join(lines).split())
    assert "waiting for data " in text and "wait per batch " in text and "training step 20 ms" in text
    assert "workers 0" in text
    assert "wait_fraction=" not in text and "num_workers" not in text
    evidence = next(f for f in findings if f.rule == "input-bound").to_dict()["evidence"]
    assert evidence["num_workers"] == 0 and 0 < evidence["wait_fraction"] <= 1  # the JSON as the rules wrote it


# --- code pastes at any width ------------------------------------------------------------------------------------


def _parses(lines: list[str], first: str, count: int) -> None:
    """The `count` printed lines from the one that starts `first` parse as Python once dedented."""
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(first))
    ast.parse(textwrap.dedent("\n".join(lines[start : start + count])))


LONG_SNIPPET = """\
from torch.utils.data import get_worker_info
info = get_worker_info()
# each worker reads its own share: the shards whose number modulo num_workers is its id (or every num_workers-th item)
shards = all_shards[info.id :: info.num_workers]  # a stride of the number of workers, from the worker's own id on"""


@pytest.mark.parametrize("width", [60, 80, 120])
def test_code_printed_by_check_tune_and_history_show_parses_at_each_width(width):
    tune_report = read_report(SAVED / "tune-a0702f8.json")
    (tuning,) = tune_report.loaders.values()
    snippet = tuning.chosen.settings.snippet()
    lines = _printed(lambda console: tune_render.render(tune_report, console), width)
    _parses(lines, snippet.splitlines()[0], len(snippet.splitlines()))

    check_report = read_report(SAVED / "check-a8c0f6b.json")
    (lr,) = check_report.loaders.values()
    verified = lr.verification.settings.snippet()
    lines = _printed(lambda console: check_render.render(check_report, console), width)
    _parses(lines, verified.splitlines()[0], len(verified.splitlines()))

    (finding, *_) = lr.findings
    finding.snippet, finding.settings_change = LONG_SNIPPET, None
    record = run_record("check", "train", lr, NOW, NOW, {"cpu_count": 2}, "train.py")
    lines = _printed(lambda console: render_run({**record.to_dict(), "id": 1}, console), width)
    _parses(lines, LONG_SNIPPET.splitlines()[0], len(LONG_SNIPPET.splitlines()))
