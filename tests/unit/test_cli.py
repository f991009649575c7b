"""The command line called in-process (exit status, output) and the console rendering of a hand-made Report."""

from __future__ import annotations

import io
import json

import pytest
from recordings import make_recording
from rich.console import Console

from loaderdoctor import scenarios
from loaderdoctor.cli import main
from loaderdoctor.history.store import load_runs
from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.words import plural
from loaderdoctor.probe.session import ProbeProgress
from loaderdoctor.render import console as console_render
from loaderdoctor.render import json as json_render
from loaderdoctor.render import tune as tune_render
from loaderdoctor.render.progress import LiveProgress
from loaderdoctor.report import Finding, LoaderReport, Report, Verification
from loaderdoctor.tune.result import LoaderTuning, TuneReport
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.trial import Measurement, Trial

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
        (["check", "--budget", "-1"], "--budget must be more than 0 seconds, not '-1'"),
        (["check", "--budget", "abc"], "--budget must be a number of seconds, not 'abc'"),
        (["check", "--budget", "inf"], "--budget must be a finite number of seconds, not 'inf'"),
        (["check", "--budget", "nan"], "--budget must be a finite number of seconds, not 'nan'"),
        (["check", "--step-ms", "-5"], "--step-ms must be 0 or more milliseconds, not '-5'"),
        (["check", "--epochs", "0"], "--epochs must be 1 or more epochs, not '0'"),
        (["check", "--epochs", "two"], "--epochs must be a whole number of epochs, not 'two'"),
        (["tune", "--max-workers", "0"], "--max-workers must be 1 or more workers, not '0'"),
        (["tune", "--budget", "1e999"], "--budget must be a finite number of seconds, not '1e999'"),
        (["bogus"], "unknown command 'bogus': use one of check, tune, scale, run, plan, history, report, scenarios"),
        ([], "give a command: one of check, tune, scale, run, plan, history, report, scenarios"),
        (["check", "--budget"], "--budget: expected one argument"),
    ],
)
def test_usage_errors_exit_2_with_a_message_in_the_users_words(capsys, argv, words):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.lstrip().startswith("error: ")
    assert words in " ".join(captured.err.split())  # rich may wrap the line
    assert "hint:" in captured.err
    assert "argument " not in captured.err  # never argparse's "argument --budget: invalid _positive value"


@pytest.mark.parametrize(
    ("argv", "schema", "words"),
    [
        (["check", "--json", "--budget", "abc"], "loaderdoctor.check/1", "--budget must be a number of seconds"),
        (["tune", "--budget", "inf", "--json"], "loaderdoctor.tune/1", "--budget must be a finite number"),
        (["check", "nope.module:fn", "--json", "--no-verify"], "loaderdoctor.check/1", "nope"),
    ],
)
def test_with_json_an_error_is_a_json_object_on_stdout_too(capsys, argv, schema, words):
    assert main(argv) == 2
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert set(document) == {"schema", "error", "hint"}
    assert document["schema"] == schema
    assert words in document["error"]
    assert document["hint"]
    assert captured.err.lstrip().startswith("error: ")  # the message is on stderr as well


def _tiny_target(tmp_path, module: str) -> str:
    """A file defining make_loader(); a module name of its own for each test, as a module is imported once."""
    path = tmp_path / f"{module}.py"
    path.write_text(TINY_LOADER)
    return f"{path}:make_loader"


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
        assert set(finding) == {"rule", "severity", "title", "evidence", "fix", "snippet", "settings_change", "impact"}
    assert loader["verification"] is None
    critical = any(f["severity"] == "critical" for f in loader["findings"])
    assert status == (1 if critical else 0)
    assert loader["epoch"]["batches"] == 8  # the loader's length, at the rate measured
    assert loader["epoch"]["epoch_s"] == pytest.approx(8 / m["batches_per_s"], rel=0.01)


def test_check_keeps_its_run_in_the_history_unless_told_not_to(tmp_path, capsys):
    target = _tiny_target(tmp_path, "tiny_loader_kept")
    argv = ["check", target, "--json", "--budget", "4", "--epochs", "1", "--no-verify"]
    main([*argv, "--epoch-batches", "1000", "--cost-per-hour", "36"])
    loader = json.loads(capsys.readouterr().out)["loaders"]["loader"]
    assert loader["epoch"]["batches"] == 1000
    assert loader["epoch"]["cost_per_epoch"] == pytest.approx(36 * loader["epoch"]["epoch_s"] / 3600, rel=0.01)
    (run,) = load_runs()
    assert (run.kind, run.name, run.target) == ("check", f"{target}/loader", target)
    assert run.measurements["batches"] == 8
    assert run.findings == loader["findings"]
    main([*argv, "--no-history"])
    assert len(load_runs()) == 1


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
        verdict="faster" if helped else "no-gain",
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
    assert "no workers (main process)" in text
    assert "critical input-bound" in " ".join(text.split())
    assert "The training step waits for data 38% of the time" in text
    assert "evidence  waiting for data 37.5%, workers 0" in text  # in words; the JSON keeps wait_fraction=0.375
    assert "✔ verified fix  num_workers=2, persistent_workers=True" in text
    assert "12.5 → 31.0 batches/s: 2.48x faster, measured with the same budget and training step" in text
    assert "loader = DataLoader(dataset, batch_size=..., num_workers=2, persistent_workers=True)" in text
    assert "kill 4242" in text  # a finding's snippet shows when it changes no setting
    assert "Summary: 1 critical, 1 info." in text


def test_console_shows_a_fix_that_did_not_help_without_its_snippet():
    text = _rendered(_report(helped=False))
    assert "≈ no measurable gain  num_workers=2, persistent_workers=True" in text
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
    diagnosis = data["loaders"]["train"]["findings"][0]  # what a saved report needs to load back (saved.py)
    assert diagnosis["settings_change"] == {"num_workers": 2, "persistent_workers": True}
    assert diagnosis["impact"] == 0.375


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


# what a user reads: 80 columns when piped, counts in words


def _tuned() -> TuneReport:
    limits = Limits(
        cores=2, memory_bytes=8 * 2**30, shm_bytes=None, max_workers=1, start_method="fork", pin_memory=False,
        threads=True,
    )  # fmt: skip
    settings = [
        Settings(),
        Settings(num_workers=1, persistent_workers=True, start_method="forkserver", pin_memory=True),
        Settings(num_workers=4, prefetch_factor=8, persistent_workers=True, start_method="forkserver"),
        Settings(num_workers=2, backend="thread"),
    ]
    trials = [
        Trial(1, settings[0], "baseline", "measured", [Measurement(10.0, "completed", 3.0)]),
        Trial(2, settings[1], "workers", "measured", [Measurement(30.0, "completed", 3.0, keeps_up=True)]),
        Trial(
            3,
            settings[2],
            "workers",
            "stalled",
            [Measurement(0.0, "stalled", 3.0)],
            note="no batch came for 10 s; the workers were stuck at dataset.py:42 in __getitem__ reading a "
            "file that another process held locked",
        ),
        Trial(4, settings[3], "threads", "other-data", [Measurement(12.0, "completed", 3.0)], note="repeats"),
    ]
    tuning = LoaderTuning("train", trials, trials[0], trials[1], limits, 12.0, "budget", 20.0)
    return TuneReport("demo", {"train": tuning})


def _lines(render, report, width: int = 80) -> list[str]:
    console = Console(record=True, width=width, file=io.StringIO())
    render(report, console)
    return console.export_text().splitlines()


def _prose(lines: list[str], snippets: list[str]) -> list[str]:
    """The lines that are not code: a snippet's lines are printed whole at any width, so that they paste as
    written (tests/unit/render/test_console.py)."""
    code = {line.strip() for snippet in snippets for line in snippet.splitlines() if line.strip()}
    return [line for line in lines if line.strip() not in code]


def test_the_tune_table_fits_80_columns_with_whole_headers_and_verdicts():
    tuned = _tuned()
    lines = _lines(tune_render.render, tuned)
    snippets = [tuning.chosen.settings.snippet() for tuning in tuned.loaders.values()]
    assert max(len(line) for line in _prose(lines, snippets)) <= 80
    header = next(line for line in lines if line.lstrip().startswith("#"))
    # at 80 columns a trial takes two lines: its figures, then its settings under them
    assert header.split() == ["#", "batches/s", "speedup", "memory", "runs", "verdict"]
    assert lines[lines.index(header) + 1].split() == ["settings"]
    assert any(line.rstrip().endswith("chosen, keeps up") for line in lines)  # a verdict is never wrapped
    text = "\n".join(lines)
    assert any(line.strip() == "1 worker, prefetch 2, persistent, forkserver, pinned" for line in lines)  # whole
    assert "1 workers" not in text and "(s)" not in text
    # the notes follow the table, each on lines of its own, starting with its trial's number
    note = next(i for i, line in enumerate(lines) if line.strip().startswith("#3 stalled: no batch came"))
    assert "__getitem__" in " ".join(lines[note : note + 3])
    assert any(line.strip() == "#4 other-data: repeats" for line in lines)
    other_data = next(line for line in lines if line.startswith("4 "))
    assert "1.20x" not in other_data and "12.0" in other_data  # rates of other data are no speedup
    assert "at most 1 worker" in text and "4 trials in 12 s" in text


def test_the_check_report_fits_80_columns_and_counts_in_words():
    rec = make_recording(
        settings=Settings(num_workers=1, persistent_workers=True),
        wait_s=0.03,
        step_s=0.05,
        epochs=1,
        batches_per_epoch=1,
    )
    report = _report()
    report.loaders["other"] = LoaderReport("other", rec, [])
    lines = _lines(console_render.render, report)
    snippets = [f.snippet for lr in report.loaders.values() for f in lr.findings if f.snippet]
    snippets += [lr.verification.settings.snippet() for lr in report.loaders.values() if lr.verification]
    assert max(len(line) for line in _prose(lines, snippets)) <= 80
    text = " ".join(" ".join(lines).split())
    assert "1 worker, prefetch 2, persistent, fork" in text
    assert "1 epoch, 1 batch in" in text and "(1 batch per epoch)" in text
    assert "(s)" not in text and "1 workers" not in text


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (Settings(), "no workers (main process)"),
        (Settings(num_workers=1, start_method="spawn"), "1 worker, prefetch 2, spawn"),
        (
            Settings(num_workers=4, prefetch_factor=4, persistent_workers=True, start_method="fork", worker_threads=1),
            "4 workers, prefetch 4, persistent, fork, 1 thread each",
        ),
        (Settings(num_workers=3, backend="thread", pin_memory=True), "3 threads, prefetch 2, pinned"),
    ],
)
def test_settings_are_described_one_way_everywhere(settings, words):
    assert settings.describe() == words
    assert words.startswith("no workers" if settings.num_workers == 0 else settings.brief())


def test_settings_named_by_what_loads():
    assert Settings().brief() == "the main process"
    assert Settings(num_workers=1).brief() == "1 worker"
    assert Settings(num_workers=2, backend="thread").brief() == "2 threads"


@pytest.mark.parametrize(
    ("count", "noun", "words"),
    [(1, "worker", "1 worker"), (2, "worker", "2 workers"), (0, "batch", "0 batches"), (3, "epoch", "3 epochs")],
)
def test_counts_in_words(count, noun, words):
    assert plural(count, noun) == words


def test_piped_output_fits_80_columns_without_the_padding_of_its_tables(capsys):
    assert main(["scenarios"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 5 and max(len(line) for line in lines) <= 80
    assert not [line for line in lines if line != line.rstrip()]  # rich pads table cells with spaces
