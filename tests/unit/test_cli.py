"""The command line called in-process (exit status, output) and the console rendering of a hand-made Report."""

from __future__ import annotations

import io
import json

import pytest
from recordings import make_recording
from rich.console import Console

from loaderdoctor import scenarios
from loaderdoctor.cli import main
from loaderdoctor.probe import ProbeProgress
from loaderdoctor.render import console as console_render
from loaderdoctor.render import json as json_render
from loaderdoctor.render.progress import LiveProgress
from loaderdoctor.report import Finding, LoaderReport, Report, Verification
from loaderdoctor.settings import Settings

TINY_LOADER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_loader():
    data = TensorDataset(torch.arange(64, dtype=torch.float32).view(32, 2), torch.arange(32))
    return DataLoader(data, batch_size=4)
"""


def test_scenarios_lists_every_scenario(capsys):
    assert main(["scenarios"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in scenarios.names():
        planted = scenarios.get(name).planted_cause or "none"
        assert any(line.startswith(f"scenario:{name} ") and planted in line for line in lines), name


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["check", "nope.module:fn"], "nope"),
        (["check", "--budget", "-1"], "must be a number more than 0, not -1"),
        (["check", "--budget", "soon"], "invalid _positive value"),
        (["bogus"], "invalid choice: 'bogus'"),
        ([], "required: command"),
    ],
)
def test_usage_errors_exit_2_with_a_message(capsys, argv, words):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.lstrip().startswith("error: ")
    assert words in " ".join(captured.err.split())  # rich may wrap the line
    assert "hint:" in captured.err


def test_check_rejects_zero_epochs(capsys):
    assert main(["check", "nope.module:fn", "--epochs", "0"]) == 2
    assert "--epochs must be 1 or more, not 0" in capsys.readouterr().err


def _tiny_target(tmp_path, module: str) -> str:
    """A file defining make_loader(); a module name of its own for each test, as a module is imported once."""
    path = tmp_path / f"{module}.py"
    path.write_text(TINY_LOADER)
    return f"{path}:make_loader"


def test_a_nan_budget_is_a_usage_error(capsys):
    assert main(["check", "nope.module:fn", "--budget", "nan"]) == 2
    assert "not nan" in capsys.readouterr().err


def test_a_nan_step_is_a_usage_error(tmp_path, capsys):
    argv = [
        "check",
        _tiny_target(tmp_path, "tiny_nan_step"),
        "--step-ms",
        "nan",
        "--budget",
        "2",
        "--epochs",
        "1",
        "--no-verify",
    ]
    assert main(argv) == 2
    assert "--step-ms" in capsys.readouterr().err


def test_check_json_on_a_tiny_loader(tmp_path, capsys):
    target = _tiny_target(tmp_path, "tiny_loader_json")
    status = main(["check", target, "--json", "--budget", "4", "--epochs", "1", "--no-verify"])
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "loaderdoctor.check/1"
    assert report["target"] == target
    assert list(report["loaders"]) == ["loader"]
    loader = report["loaders"]["loader"]
    assert loader["settings"] == Settings().to_dict()
    m = loader["measurements"]
    assert isinstance(m["batches_per_s"], float)
    assert m["batches_per_s"] > 0
    assert m["epochs"] == 1
    assert m["batches"] == 8
    assert len(m["first_batch_s"]) == 1
    assert isinstance(m["first_batch_s"][0], float)
    assert m["wait_fraction"] is None  # no training step
    assert m["outcome"] == "completed"
    assert isinstance(loader["findings"], list)
    for finding in loader["findings"]:
        assert set(finding) == {"rule", "severity", "title", "evidence", "fix", "snippet"}
    assert loader["verification"] is None
    critical = any(f["severity"] == "critical" for f in loader["findings"])
    assert status == (1 if critical else 0)


# rendering


def _report(helped: bool = True) -> Report:
    rec = make_recording(settings=Settings(), wait_s=0.03, step_s=0.05, dataset="Pairs", dataset_len=160)
    fixed = Settings(num_workers=2, persistent_workers=True)
    findings = [
        Finding(
            rule="input-bound",
            severity="critical",
            title="The training step waits for data 38% of the time",
            evidence={"wait_fraction": 0.375, "num_workers": 0},
            fix="Load in worker processes.",
            snippet=fixed.snippet(),
            settings_change={"num_workers": 2, "persistent_workers": True},
            impact=0.375,
        ),
        Finding(
            rule="stray-workers",
            severity="info",
            title="1 stray worker process",
            evidence={"pids": [4242]},
            fix="End it.",
            snippet="kill 4242",
        ),
    ]
    verification = Verification(
        settings=fixed,
        before=12.5,
        after=31.0 if helped else 12.0,
        before_outcome="completed",
        after_outcome="completed",
        helped=helped,
        note=(
            "2.48x faster, measured with the same budget and training step" if helped else "no measurable gain (0.96x)"
        ),
    )
    return Report("demo", {"train": LoaderReport("train", rec, findings, verification)})


def _rendered(report: Report) -> str:
    console = Console(record=True, width=100, file=io.StringIO())
    console_render.render(report, console)
    return console.export_text()


def test_console_shows_findings_and_the_verified_fix():
    text = _rendered(_report())
    assert "loaderdoctor check demo" in text
    assert "loader 'train'" in text
    assert "num_workers=0 (loading runs in the training process)" in text
    assert "critical input-bound" in " ".join(text.split())
    assert "The training step waits for data 38% of the time" in text
    assert "evidence  wait_fraction=0.375, num_workers=0" in text
    assert "✔ verified fix  num_workers=2, persistent_workers=True" in text
    assert "12.5 → 31.0 batches/s: 2.48x faster, measured with the same budget and training step" in text
    assert "loader = DataLoader(dataset, batch_size=..., num_workers=2, persistent_workers=True)" in text
    assert "kill 4242" in text  # a finding's snippet shows when it changes no setting
    assert "Summary: 1 critical, 1 info." in text


def test_console_shows_a_fix_that_did_not_help_without_its_snippet():
    text = _rendered(_report(helped=False))
    assert "✘ not a fix  num_workers=2, persistent_workers=True" in text
    assert "12.5 → 12.0 batches/s: no measurable gain (0.96x)" in text
    assert "loader = DataLoader(" not in text
    assert "✔ verified fix" not in text


def test_console_says_when_nothing_was_found():
    rec = make_recording()
    text = _rendered(Report("scenario:healthy", {"loader": LoaderReport("loader", rec, [])}))
    assert "No problems found." in text
    assert "Summary: no findings." in text


def test_json_render_matches_the_report():
    report = _report()
    data = json.loads(json_render.render(report))
    assert data == json.loads(json.dumps(report.to_dict()))
    verification = data["loaders"]["train"]["verification"]
    assert verification["speedup"] == 2.48
    assert verification["settings"] == Settings(num_workers=2, persistent_workers=True).to_dict()
    assert [f["rule"] for f in data["loaders"]["train"]["findings"]] == ["input-bound", "stray-workers"]
    assert "settings_change" not in data["loaders"]["train"]["findings"][0]


def test_report_exit_status():
    assert _report().exit_status == 1
    assert Report("x", {"loader": LoaderReport("loader", make_recording(), [])}).exit_status == 0


def test_live_progress_writes_nothing_when_not_a_terminal():
    out = io.StringIO()
    console = Console(file=out, width=100)
    assert not console.is_terminal
    figures = ProbeProgress(epoch=0, epochs=3, batches=5, elapsed_s=1.0, budget_s=10.0)
    with LiveProgress(console) as live:
        live.check_update("train", "measure", figures)
        live.tune_update("train", "4 workers, prefetch 2", figures)
    assert out.getvalue() == ""


def _write_target(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return f"{path}:make"


def test_an_unpicklable_dataset_under_spawn_is_a_usage_error_naming_it(tmp_path, capsys):
    target = _write_target(
        tmp_path,
        "spawn_lock",
        "import threading, torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Locked(Dataset):\n"
        "    def __init__(self): self.lock = threading.Lock()\n"
        "    def __len__(self): return 8\n"
        "    def __getitem__(self, i): return torch.zeros(2)\n"
        "def make(): return DataLoader(Locked(), batch_size=4, num_workers=2, multiprocessing_context='spawn')\n",
    )
    assert main(["check", target, "--budget", "5"]) == 2
    err = capsys.readouterr().err
    assert "dataset (Locked) cannot be pickled" in err and "'spawn'" in err
    assert "Traceback" not in err


def test_a_training_step_that_raises_is_reported_with_its_line(tmp_path, capsys):
    target = _write_target(
        tmp_path,
        "bad_step",
        "import torch, loaderdoctor\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "def step(batch):\n"
        "    raise RuntimeError('shapes do not match')\n"
        "def make(): return loaderdoctor.Workload(DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4),"
        " step=step)\n",
    )
    assert main(["check", target, "--budget", "5", "--no-verify"]) == 1
    err = capsys.readouterr().err
    assert "the training step raised RuntimeError: shapes do not match" in err
    assert "bad_step.py:4 in step" in err
