"""What reports say without noise or inflation: no share of a limit or of the cores over 100%, stray workers once
per report with one kill line, and other processes named by their program, never by their arguments."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from recordings import make_host, make_recording
from rich.console import Console

from loaderdoctor.history.records import now_iso, run_record
from loaderdoctor.history.store import save_run
from loaderdoctor.host import facts as host
from loaderdoctor.host.facts import OtherLoad, program_name
from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.limit import host_limit, limit_words
from loaderdoctor.recording.record import OtherProcess, Recording, StrayProcess
from loaderdoctor.recording.usage import LoadingCpu
from loaderdoctor.render import console as console_render
from loaderdoctor.render.kinds import report_page
from loaderdoctor.render.scale import rank_words
from loaderdoctor.render.tune import limit_words as tune_limit_words
from loaderdoctor.report import LoaderReport, Report
from loaderdoctor.rules import diagnose
from loaderdoctor.rules.throughput import _cpu_words
from loaderdoctor.scale.report import RankFigures
from loaderdoctor.tune.result import LoaderTuning
from loaderdoctor.tune.space import Limits
from loaderdoctor.tune.trial import Measurement, Trial

SECRET = "--db-password=hunter2-secret"


def _rendered(report: Report) -> str:
    out = io.StringIO()
    console_render.render(report, Console(file=out, width=200, color_system=None))
    return out.getvalue()


# (b) shares of a limit and of the cores


def test_a_rate_past_the_limit_by_noise_is_at_the_limit():
    rec = make_recording(settings=Settings(num_workers=0), wait_s=0.05, wait_cpu_share=1.0, step_s=0.02)
    limit = host_limit(rec)
    assert limit.batches_per_s is not None
    words = limit_words(limit, 1.05 * limit.batches_per_s, fixed_rate=1.1 * limit.batches_per_s)
    assert "105%" not in words and "110%" not in words
    assert words.startswith("at this host's limit of ")
    assert words.endswith("; the fix reaches it")
    below = limit_words(limit, 0.4 * limit.batches_per_s)
    assert below.startswith("40% of this host's limit of ")


def test_a_ranks_share_past_its_limit_is_at_it():
    figures = RankFigures(0, 320.0, 0.1, 100, "completed", share_of_limit=1.07)
    assert rank_words(figures) == "r0 320.0 (10%; at limit)"
    assert (
        rank_words(RankFigures(0, 320.0, 0.1, 100, "completed", share_of_limit=0.9)) == "r0 320.0 (10%; 90% of limit)"
    )


def test_the_tuners_shares_of_the_limit_stop_at_it():
    def trial(number: int, workers: int, rate: float, backend: str = "process") -> Trial:
        persistent = {"persistent_workers": True} if backend == "process" else {}
        settings = Settings(num_workers=workers, backend=backend, **persistent)
        trial = Trial(number, settings, "workers", "measured")
        trial.runs.append(Measurement(rate, "completed", 2.0, limit_batches_per_s=40.0, limit_binds="loading-cpu"))
        return trial

    limits = Limits(2.0, 8 * 2**30, None, 8, "fork", False, True)
    baseline, two = trial(1, 1, 16.0), trial(2, 2, 42.0)  # 2 workers measured 5% past the limit they measured
    words = tune_limit_words(LoaderTuning("train", [baseline, two], baseline, two, limits, 10.0, "converged", 20.0))
    assert "105%" not in words
    assert words.endswith("the baseline at 40% of it and the choice at it")
    threads = trial(3, 2, 52.0, backend="thread")  # threads copy no batch: they can pass a processes' limit
    words = tune_limit_words(LoaderTuning("train", [two, threads], two, threads, limits, 10.0, "converged", 20.0))
    assert "130%" not in words
    assert "the choice past it (the limit was measured with worker processes" in words


def test_loading_past_the_available_cores_kept_them_all_busy():
    # Other processes took 1.2 of 2 cores: 1.0 is left (at least a core), and loading's sampled 1.1 passes it.
    cpu = LoadingCpu(cores=1.1, loaders=2, usable_cores=2.0, main_cores=None, other_cores=1.2)
    assert cpu.available_cores == 1.0
    words = _cpu_words(cpu, 2)
    assert "1.1 of the 1.0" not in words
    assert words.startswith("its 2 workers kept all 1.0 available cores busy")
    within = LoadingCpu(cores=0.6, loaders=2, usable_cores=2.0, main_cores=None, other_cores=None)
    assert _cpu_words(within, 2) == "its 2 workers kept 0.6 of the 2.0 available cores busy"


def test_other_processes_past_this_processs_cores_are_no_share_of_them():
    words = console_render._busy_host(6.0, 2.0, [OtherProcess(4242, "python3 hog.py", 6.0)])
    assert "of the 2 usable cores" not in words
    assert words.startswith("other processes kept 6.0 cores of the machine busy while this was measured, more than")
    assert console_render._busy_host(1.0, 2.0, []) == (
        "other processes took 1.0 of the 2 usable cores while this was measured"
    )


# (c) stray workers: once per report


def _with_strays(host_strays: list[StrayProcess]) -> Recording:
    return make_recording(host=make_host(stray_workers=host_strays))


def test_stray_workers_show_once_in_a_report_of_two_loaders_with_one_kill_line():
    strays = [StrayProcess(pid=4242 + i, cmdline="python3 train.py", cpu_percent=40.0, age_s=600) for i in range(2)]
    loaders = {}
    for name in ("train", "val"):
        rec = _with_strays(strays)
        loaders[name] = LoaderReport(name, rec, diagnose(rec))
    assert all(any(f.rule == "stray-workers" for f in lr.findings) for lr in loaders.values())
    report = Report("demo", loaders)
    text = _rendered(report)
    assert text.count("stray-workers") == 1
    assert text.count("kill 4242 4243") == 1
    assert text.index("loader 'val'") < text.index("this machine") < text.index("stray-workers")
    assert text.count("No problems found.") == 2  # the loaders' own findings: none
    assert "Summary: 1 critical." in text
    page = report_page(report)
    assert page.count("stray-workers") == 1
    assert page.count("kill 4242 4243") == 1
    assert "summary: 1 critical" in page


# (d) other processes: program and pid, never arguments


@pytest.mark.parametrize(
    ("argv", "name", "program"),
    [
        (["/tmp/venv/bin/python3", "/tmp/ld/train_b.py", SECRET], "python3", "python3 train_b.py"),
        (
            ["python3", "-u", "-W", "ignore", "-m", "torch.distributed.run", SECRET, "t.py"],
            "",
            "python3 -m torch.distributed.run",
        ),
        (["/usr/bin/python3.11", "-c", f"import x; x.run('{SECRET}')"], "python3.11", "python3.11 -c"),
        (["/usr/lib/postgresql/bin/postgres", SECRET], "postgres", "postgres"),
        ([f"postgres: alice mydb {SECRET}"], "postgres", "postgres"),  # a title written over argv
        (["/usr/bin/python3", "train.py", SECRET], "pt_main_thread", "python3 train.py"),  # torch renames the thread
        ([], "kworker/0:1", "kworker/0:1"),  # no command line: its name
    ],
)
def test_a_process_is_named_by_its_program_without_its_arguments(argv, name, program):
    assert program_name(argv, name) == program
    assert program_name(program.split()) == program  # as a report shows a name it kept, or an old command line


def test_an_old_reports_long_command_line_still_loads_and_shows_as_its_program():
    old_cmdline = f"/tmp/pytest-of-root/pytest-7/venv/bin/python3 /tmp/ld/train_b.py {SECRET} --epochs 90"[:200]
    rec = make_recording()
    rec.other_processes = [OtherProcess(4242, old_cmdline, 1.5)]
    rec.host.stray_workers = [StrayProcess(5151, old_cmdline, 80.0, 600.0)]
    loaded = Recording.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert loaded.other_processes[0].cmdline == old_cmdline
    report = Report("demo", {"train": LoaderReport("train", loaded, diagnose(loaded))})
    text, page = _rendered(report), report_page(report)
    assert "pid 4242 (python3 train_b.py, 1.5 cores)" in page
    assert "programs python3 train_b.py" in " ".join(text.split())  # the evidence in words
    assert "hunter2" not in text and "hunter2" not in page


def _busy_process(tmp_path) -> subprocess.Popen:
    script = tmp_path / "train_b.py"
    script.write_text("import time\nend = time.time() + 30\nwhile time.time() < end:\n    pass\n")
    return subprocess.Popen([sys.executable, str(script), SECRET])


@pytest.mark.timeout(60)
@pytest.mark.workers
def test_a_real_process_with_a_password_in_its_arguments_leaves_no_trace_of_it(tmp_path, monkeypatch):
    """A busy process started with --db-password=...: OtherLoad and the stray-worker scan name it by its
    program, and neither the report's JSON nor the history's file holds the password."""
    expected = f"{Path(sys.executable).name} train_b.py"
    proc = _busy_process(tmp_path)
    try:
        deadline = time.monotonic() + 20
        while SECRET not in psutil.Process(proc.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has exec'd the script
        assert SECRET in psutil.Process(proc.pid).cmdline()  # there to be leaked
        load = OtherLoad(own=lambda: {os.getpid()})  # the process is our child: counted as another's here
        named: list[OtherProcess] = []
        while not named and time.monotonic() < deadline:
            time.sleep(0.3)
            load.observe()
            named = [p for p in load.busiest(seconds=1.0) if p.pid == proc.pid]
        monkeypatch.setattr(host, "_orphaned_workers", lambda orphans: [psutil.Process(proc.pid)])
        strays = [s for s in host.stray_workers() if s.pid == proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert [p.cmdline for p in named] == [expected]
    assert [s.cmdline for s in strays] == [expected]
    rec = make_recording(host=make_host(stray_workers=strays))
    rec.other_processes = named
    report = LoaderReport("train", rec, diagnose(rec))
    assert "hunter2" not in json.dumps(Report("demo", {"train": report}).to_dict())
    assert "hunter2" not in _rendered(Report("demo", {"train": report}))
    stored = tmp_path / "history.sqlite"
    now = now_iso()
    kept = {"stray_workers": [dataclasses.asdict(s) for s in strays]}
    assert save_run(run_record("check", "demo:train", report, now, now, kept), stored) is not None
    assert b"hunter2" not in b"".join(path.read_bytes() for path in tmp_path.glob("history.sqlite*"))
    assert expected.encode() in b"".join(path.read_bytes() for path in tmp_path.glob("history.sqlite*"))
