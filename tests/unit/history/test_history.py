"""The run history: where it lives, RunRecords in and out of SQLite, its schema versions, failures that must not
crash a training run, many processes writing at once, and `loaderdoctor history`."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import multiprocessing.synchronize
import random
import sqlite3
from pathlib import Path

import pytest

from loaderdoctor.cli import main
from loaderdoctor.errors import LoaderDoctorError, LoaderDoctorWarning
from loaderdoctor.history import store
from loaderdoctor.history.records import RunRecord, parse_iso
from loaderdoctor.history.store import History, HistoryWarning, history_path, load_run, load_runs, save_run

WRITERS, RUNS_EACH = 8, 50


def make_run(
    name: str = "resnet",
    kind: str = "check",
    started_at: str = "2026-11-23T13:02:05.123+00:00",
    *,
    rate: float = 40.125,
    workers: int = 4,
    findings: list | None = None,
) -> RunRecord:
    start = parse_iso(started_at)
    return RunRecord(
        name=name,
        kind=kind,
        started_at=started_at,
        ended_at=(start + datetime.timedelta(seconds=65.5)).isoformat(timespec="milliseconds"),
        host={
            "cpu_count": 16,
            "start_method": "fork",
            "cuda_initialised": False,
            "other_processes": [{"pid": 4242, "cmdline": "python other.py", "cores": 1.5}],
        },
        settings={"num_workers": workers, "prefetch_factor": 2 if workers else None, "persistent_workers": False},
        measurements={"batches_per_s": rate, "samples_per_s": rate * 32, "wait_fraction": 0.62, "batches": 64},
        findings=[
            {
                "rule": "input-bound",
                "severity": "critical",
                "title": "training waits on loading 62% of the time",
                "evidence": {"wait_fraction": 0.62},
                "fix": "use 8 workers",
                "snippet": "DataLoader(dataset, num_workers=8)",
            }
        ]
        if findings is None
        else findings,
        dataset={"name": "TensorDataset", "len": 1000, "batch_size": 32, "batches_per_epoch": 32},
        target="demo" if kind != "watch" else None,
    )


def _stamp(minute: int, offset_hours: int = 0) -> str:
    """started_at for the given minute past 12:00 UTC, written in a zone `offset_hours` from UTC."""
    moment = datetime.datetime(2026, 11, 23, 12, minute, tzinfo=datetime.UTC)
    zone = datetime.timezone(datetime.timedelta(hours=offset_hours))
    return moment.astimezone(zone).isoformat(timespec="milliseconds")


# --- where it lives


def test_history_path_prefers_loaderdoctor_home_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("LOADERDOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert history_path() == tmp_path / "home" / "history.sqlite3"
    monkeypatch.delenv("LOADERDOCTOR_HOME")
    assert history_path() == tmp_path / "xdg" / "loaderdoctor" / "history.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert history_path() == tmp_path / "user" / ".local" / "share" / "loaderdoctor" / "history.sqlite3"


def test_tests_write_into_a_private_home(private_history_home):
    assert history_path() == private_history_home / "history.sqlite3"
    assert save_run(make_run()) == 1
    assert (private_history_home / "history.sqlite3").is_file()


# --- records in and out


def test_a_run_comes_back_equal_and_gets_its_id(tmp_path):
    path = tmp_path / "deep" / "folder" / "history.sqlite3"  # folders made on the way
    run = make_run()
    with History(path) as history:
        run_id = history.add(run)
        assert run_id == 1 and run.id == 1
        assert history.get(1) == run
    with History(path) as history:  # and from a fresh connection
        again = history.get(1)
    assert again == run
    assert again.to_dict() == run.to_dict()
    assert again.duration_s == 65.5
    assert again.findings[0]["evidence"] == {"wait_fraction": 0.62}
    assert again.host["other_processes"] == [{"pid": 4242, "cmdline": "python other.py", "cores": 1.5}]


def test_numbers_json_cannot_hold_are_kept_as_none(tmp_path):
    run = make_run(rate=float("nan"))
    run.measurements["wait_fraction"] = float("inf")
    with History(tmp_path / "h.sqlite3") as history:
        saved = history.get(history.add(run))
    assert saved.measurements["batches_per_s"] is None
    assert saved.measurements["wait_fraction"] is None
    assert saved.measurements["batches"] == 64


def test_runs_filter_by_name_and_kind_newest_first(tmp_path):
    with History(tmp_path / "h.sqlite3") as history:
        ids = {
            "a-check-10": history.add(make_run("a", "check", _stamp(10))),
            "b-watch-20": history.add(make_run("b", "watch", _stamp(20))),
            # written in UTC+5: later than 12:20 UTC though its text sorts first
            "a-watch-30": history.add(make_run("a", "watch", _stamp(30, offset_hours=5))),
            "a-tune-05": history.add(make_run("a", "tune", _stamp(5, offset_hours=-3))),
            "b-check-30": history.add(make_run("b", "check", _stamp(30))),  # same moment: the later id first
        }
        newest_first = ["b-check-30", "a-watch-30", "b-watch-20", "a-check-10", "a-tune-05"]
        assert [run.id for run in history.runs()] == [ids[key] for key in newest_first]
        assert [run.id for run in history.runs(name="a")] == [ids["a-watch-30"], ids["a-check-10"], ids["a-tune-05"]]
        assert [run.id for run in history.runs(kind="watch")] == [ids["a-watch-30"], ids["b-watch-20"]]
        assert [run.id for run in history.runs(name="b", kind="check")] == [ids["b-check-30"]]
        assert history.runs(name="nobody") == []
        assert [run.id for run in history.runs(limit=2)] == [ids["b-check-30"], ids["a-watch-30"]]
        assert [run.id for run in history.runs(name="a", limit=1)] == [ids["a-watch-30"]]
        assert history.latest().id == ids["b-check-30"]
        assert history.get(999) is None


def test_an_empty_history_has_no_latest_run(tmp_path):
    with History(tmp_path / "h.sqlite3") as history:
        assert history.latest() is None
        assert history.runs() == []


def test_reading_a_history_never_written_creates_nothing(tmp_path):
    path = tmp_path / "none" / "history.sqlite3"
    assert load_runs(path=path) == []
    assert load_run(1, path=path) is None
    assert not path.parent.exists()


def test_save_run_returns_the_id_and_load_runs_reads_it_back(tmp_path):
    path = tmp_path / "h.sqlite3"
    first, second = make_run("a", started_at=_stamp(1)), make_run("b", started_at=_stamp(2))
    assert save_run(first, path) == 1
    assert save_run(second, path) == 2
    assert load_runs(path=path) == [second, first]
    assert load_runs(name="a", path=path) == [first]
    assert load_run(2, path=path) == second


def test_an_unreadable_row_hides_no_other_run(tmp_path, caplog):
    path = tmp_path / "h.sqlite3"
    good = make_run(started_at=_stamp(1))
    with History(path) as history:
        history.add(good)
    db = sqlite3.connect(path)
    with db:  # a kind from a newer loaderdoctor, and a damaged record
        rest = json.dumps({"host": {}, "settings": {}, "measurements": {}, "findings": []})
        db.execute("INSERT INTO runs VALUES (2, 'x', 'future', ?, ?, ?)", (_stamp(2), _stamp(3), rest))
        db.execute("INSERT INTO runs VALUES (3, 'y', 'check', ?, ?, 'not json')", (_stamp(2), _stamp(3)))
    db.close()
    with History(path) as history:
        assert history.runs() == [good]
        with pytest.raises(LoaderDoctorError, match=r"run 2 in the history at .* cannot be read: unknown run kind"):
            history.get(2)
    assert [record.message.split(":")[0] for record in caplog.records] == [
        f"run 3 in the history at {path} cannot be read",
        f"run 2 in the history at {path} cannot be read",
    ]


# --- schema versions


def _pragma(path: Path, name: str) -> object:
    db = sqlite3.connect(path)
    try:
        return db.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        db.close()


def _set_version(path: Path, version: int) -> None:
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {version}")
    db.commit()
    db.close()


def test_a_version_0_database_is_migrated_to_the_current_schema(tmp_path):
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.execute("VACUUM")  # a valid, empty database file: version 0
    db.close()
    assert _pragma(path, "user_version") == 0
    with History(path) as history:
        assert history.add(make_run()) == 1
    assert _pragma(path, "user_version") == store.SCHEMA_VERSION == 1
    assert _pragma(path, "journal_mode") == "wal"


def test_a_version_1_database_opens_as_it_is(tmp_path):
    path = tmp_path / "h.sqlite3"
    run = make_run()
    with History(path) as history:
        history.add(run)
    assert _pragma(path, "user_version") == 1
    with History(path) as history:
        assert history.runs() == [run]
    assert _pragma(path, "user_version") == 1


def test_a_migration_appended_runs_once_in_order_and_keeps_the_runs(tmp_path, monkeypatch):
    path = tmp_path / "h.sqlite3"
    run = make_run()
    with History(path) as history:
        history.add(run)
    applied = []

    def add_notes(db: sqlite3.Connection) -> None:
        applied.append(db.execute("PRAGMA user_version").fetchone()[0])
        db.execute("ALTER TABLE runs ADD COLUMN notes TEXT")

    monkeypatch.setattr(store, "MIGRATIONS", [*store.MIGRATIONS, add_notes])
    monkeypatch.setattr(store, "SCHEMA_VERSION", 2)
    with History(path) as history:
        assert history.runs() == [run]
    with History(path) as history:  # already at version 2: not again
        assert history.get(1) == run
    assert applied == [1]
    assert _pragma(path, "user_version") == 2


def test_a_newer_schema_is_refused_clearly_and_save_run_only_warns(tmp_path):
    path = tmp_path / "h.sqlite3"
    with History(path) as history:
        history.add(make_run())
    _set_version(path, 7)
    with pytest.raises(LoaderDoctorError) as raised:
        History(path)
    assert raised.value.message == f"history at {path} has schema version 7; this loaderdoctor knows up to 1"
    assert raised.value.hint == "upgrade loaderdoctor or set LOADERDOCTOR_HOME to another folder"
    with pytest.warns(HistoryWarning, match="schema version 7; this loaderdoctor knows up to 1") as caught:
        assert save_run(make_run(), path) is None
    assert len(caught) == 1
    assert "LOADERDOCTOR_HOME" in str(caught[0].message)
    assert _pragma(path, "user_version") == 7  # left as it was
    assert issubclass(HistoryWarning, LoaderDoctorWarning)


# --- failures a training run must survive


def _corrupt_file(path: Path) -> bytes:
    garbage = random.Random(11).randbytes(8192)
    path.write_bytes(garbage)
    return garbage


def test_a_corrupt_database_makes_save_run_warn_and_is_left_alone(tmp_path):
    path = tmp_path / "h.sqlite3"
    garbage = _corrupt_file(path)
    with pytest.warns(HistoryWarning, match="is damaged") as caught:
        assert save_run(make_run(), path) is None
    assert len(caught) == 1
    message = str(caught[0].message)
    assert str(path) in message and f"mv {path} {path}.broken" in message
    assert path.read_bytes() == garbage
    with pytest.raises(LoaderDoctorError, match="is damaged"):
        load_runs(path=path)


def test_a_folder_that_is_a_file_makes_save_run_warn(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the history's folder would be")
    with pytest.warns(HistoryWarning, match="is a file, not a folder") as caught:
        assert save_run(make_run(), blocker / "sub" / "history.sqlite3") is None
    assert len(caught) == 1
    assert str(blocker) in str(caught[0].message) and "LOADERDOCTOR_HOME" in str(caught[0].message)
    assert blocker.read_text() == "a file where the history's folder would be"


def test_save_run_to_the_default_place_warns_when_it_cannot_be_made(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LOADERDOCTOR_HOME", str(blocker))
    with pytest.warns(HistoryWarning, match="did not save the watch run 'etl'"):
        assert save_run(make_run("etl", "watch")) is None


def test_a_history_locked_past_the_timeout_makes_save_run_warn(tmp_path):
    path = tmp_path / "h.sqlite3"
    History(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.warns(HistoryWarning, match="stayed locked by another process for over 0.2 s"):
            assert save_run(make_run(), path, timeout_s=0.2) is None
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert save_run(make_run(), path, timeout_s=0.2) == 1  # once free, the next run is kept


# --- many writers at once


def _write_runs(path: str, writer: int, start: multiprocessing.synchronize.Barrier) -> None:
    """One process (a rank, a job) writing its runs as fast as it can, each run telling who wrote it."""
    with History(Path(path)) as history:
        start.wait(timeout=60)
        for number in range(RUNS_EACH):
            run = make_run(f"writer-{writer}", "watch", _stamp(number % 60), rate=float(writer * 1000 + number))
            run.measurements["writer"], run.measurements["number"] = writer, number
            history.add(run)


@pytest.mark.timeout(120)
@pytest.mark.workers
def test_many_processes_writing_at_once_lose_no_run(tmp_path):
    path = tmp_path / "shared" / "history.sqlite3"  # not there yet: the writers race to create it too
    # fork: the writers start at once, not after each has imported torch again on a loaded machine; each still
    # opens its own History, as separate ranks and jobs do
    context = multiprocessing.get_context("fork")
    start = context.Barrier(WRITERS)
    writers = [context.Process(target=_write_runs, args=(str(path), w, start)) for w in range(WRITERS)]
    try:
        for process in writers:
            process.start()
        for process in writers:
            process.join(timeout=100)
        assert [process.exitcode for process in writers] == [0] * WRITERS
    finally:
        for process in writers:
            if process.is_alive():
                process.kill()
                process.join()
    with History(path) as history:
        runs = history.runs()
    assert len(runs) == WRITERS * RUNS_EACH
    assert sorted(run.id for run in runs) == list(range(1, WRITERS * RUNS_EACH + 1))
    written = {(run.measurements["writer"], run.measurements["number"]) for run in runs}
    assert written == {(w, n) for w in range(WRITERS) for n in range(RUNS_EACH)}
    for run in runs:  # each row holds its own writer's content, not a neighbour's
        writer, number = run.measurements["writer"], run.measurements["number"]
        assert run.name == f"writer-{writer}"
        assert run.measurements["batches_per_s"] == writer * 1000 + number
        assert run.started_at == _stamp(number % 60)


# --- loaderdoctor history


@pytest.fixture
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich reads it: a table row stays on one line


@pytest.fixture
def saved_runs(wide_console) -> list[RunRecord]:
    runs = [
        make_run("resnet", "check", _stamp(1), rate=40.125, workers=0),
        make_run("bert", "watch", _stamp(2), rate=210.0, workers=4, findings=[]),
        make_run("resnet", "tune", _stamp(3), rate=95.5, workers=8),
    ]
    for run in runs:
        assert save_run(run) is not None
    return runs


def _local(text: str) -> str:
    return parse_iso(text).astimezone().strftime("%Y-%m-%d %H:%M")


def test_history_lists_runs_newest_first_as_a_table(capsys, saved_runs):
    assert main(["history"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["when", "id", "name", "kind", "settings", "batches/s", "waiting", "main", "finding"]
    rows = lines[1:4]
    assert [row.split()[2] for row in rows] == ["3", "2", "1"]
    tune, watch, check = rows
    assert tune.startswith(_local(saved_runs[2].started_at))
    assert "resnet" in tune and "tune" in tune and "8 workers" in tune and "95.5" in tune and "62%" in tune
    assert "input-bound: training waits on loading 62% of the time" in tune
    assert "bert" in watch and "4 workers" in watch and "210.0" in watch and watch.rstrip().endswith("none")
    assert "the main process" in check and "40.1" in check
    assert "3 runs, newest first" in lines[4]


def test_history_filters_by_name_and_limits(capsys, saved_runs):
    assert main(["history", "--name", "resnet"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[2] for row in rows if row.startswith("2026")] == ["3", "1"]
    assert main(["history", "--limit", "1", "--json"]) == 0
    assert [run["id"] for run in json.loads(capsys.readouterr().out)["runs"]] == [3]


def test_history_json_has_the_schema_and_every_field(capsys, saved_runs):
    assert main(["history", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "loaderdoctor.history/1"
    assert [run["id"] for run in document["runs"]] == [3, 2, 1]
    for key in ("id", "name", "kind", "started_at", "ended_at", "host", "settings", "measurements", "findings"):
        assert key in document["runs"][0]
    assert [RunRecord.from_dict(run) for run in document["runs"]] == saved_runs[::-1]


def test_history_show_prints_one_run_in_detail(capsys, saved_runs):
    assert main(["history", "show", "1"]) == 0
    out = capsys.readouterr().out
    words = " ".join(out.split())
    assert words.startswith("run 1 resnet (check)")
    assert "target demo" in words
    start, end = saved_runs[0].started_at, saved_runs[0].ended_at
    assert f"{parse_iso(start).astimezone():%Y-%m-%d %H:%M:%S} to {parse_iso(end).astimezone():%H:%M:%S}" in words
    assert "(65.5 s)" in words
    assert "cpu_count 16" in words and "start_method fork" in words
    assert "other_processes pid=4242, cmdline=python other.py, cores=1.5" in words
    assert "settings no workers (main process)" in words
    assert "rate 40.1 batches/s, 1284 samples/s" in words and "waiting 62% of the time" in words
    assert "critical input-bound training waits on loading 62% of the time" in words
    assert "evidence waiting for data 62%" in words and "fix use 8 workers" in words  # in words, not key=value
    assert "DataLoader(dataset, num_workers=8)" in words


def test_history_show_json_is_a_list_of_one(capsys, saved_runs):
    assert main(["history", "show", "2", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "loaderdoctor.history/1"
    assert [RunRecord.from_dict(run) for run in document["runs"]] == [saved_runs[1]]
    assert main(["history", "show", "latest", "--json"]) == 0
    assert [run["id"] for run in json.loads(capsys.readouterr().out)["runs"]] == [3]


def test_history_show_a_missing_id_is_a_usage_error(capsys, saved_runs):
    assert main(["history", "show", "999"]) == 2
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert captured.out == ""
    assert f"error: no run 999 in the history at {history_path()}" in err
    assert "hint: `loaderdoctor history` lists the runs" in err
    assert main(["history", "show", "999", "--json"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "loaderdoctor.history/1" and "no run 999" in document["error"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["history", "show"], "history show needs a run id"),
        (["history", "show", "abc"], "history show takes a run id (a whole number) or 'latest', not 'abc'"),
        (["history", "list"], "unknown history action 'list'"),
        (["history", "--limit", "0"], "--limit must be 1 or more runs, not '0'"),
    ],
)
def test_history_usage_errors_exit_2(capsys, wide_console, argv, words):
    assert main(argv) == 2
    assert words in " ".join(capsys.readouterr().err.split())


def test_history_without_runs_says_where_they_would_be(capsys, wide_console):
    assert main(["history"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out == (
        f"No runs in the history at {history_path()} yet: every run of loaderdoctor watch, check, tune and scale is "
        "kept there."
    )
    assert not history_path().exists()
    assert main(["history", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"schema": "loaderdoctor.history/1", "runs": []}


def test_history_of_a_corrupt_database_says_so_without_a_traceback(capsys, wide_console):
    history_path().parent.mkdir(parents=True, exist_ok=True)
    _corrupt_file(history_path())
    assert main(["history"]) == 1
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert f"error: the history at {history_path()} is damaged" in err
    assert f"hint: move it aside (mv {history_path()} {history_path()}.broken)" in err
    assert "Traceback" not in captured.err


def test_history_of_a_newer_schema_says_to_upgrade(capsys, wide_console):
    History().close()
    _set_version(history_path(), 3)
    assert main(["history", "show", "1"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "has schema version 3; this loaderdoctor knows up to 1" in err
    assert "hint: upgrade loaderdoctor or set LOADERDOCTOR_HOME to another folder" in err


def test_the_history_is_this_users_alone(tmp_path):
    """Its runs name other processes: the folder is 0700 and the database (and its WAL files) 0600, an older
    world-readable file narrowed."""
    import os
    import stat as stat_module

    from loaderdoctor.history.store import History

    path = tmp_path / "home" / "history.sqlite3"
    History(path).close()
    assert stat_module.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat_module.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o644)
    History(path).close()
    assert stat_module.S_IMODE(os.stat(path).st_mode) == 0o600
    for extra in path.parent.glob("history.sqlite3-*"):
        assert stat_module.S_IMODE(os.stat(extra).st_mode) & 0o077 == 0


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("measurements", [1, 2], "measurements is list, not dict"),
        ("findings", {"rule": "x"}, "findings is dict, not list"),
        ("findings", [{"rule": 3, "severity": "critical", "title": "t"}], r"findings\[0\] is no finding"),
        ("host", "busy", "host is str, not dict"),
        ("target", 7, "target is int, not str or NoneType"),
    ],
)
def test_a_row_of_wrong_types_is_skipped_with_a_warning_as_a_damaged_one_is(tmp_path, caplog, field, value, said):
    path = tmp_path / "h.sqlite3"
    good = make_run(started_at=_stamp(1))
    with History(path) as history:
        history.add(good)
    rest = {"host": {}, "settings": {}, "measurements": {}, "findings": [], field: value}
    db = sqlite3.connect(path)
    with db:
        db.execute("INSERT INTO runs VALUES (2, 'x', 'watch', ?, ?, ?)", (_stamp(2), _stamp(3), json.dumps(rest)))
    db.close()
    with History(path) as history:
        assert history.runs() == [good]
        with pytest.raises(LoaderDoctorError, match=f"run 2 in the history at .* cannot be read: {said}"):
            history.get(2)


def test_history_and_report_of_a_wrong_typed_row_say_so_without_a_traceback(tmp_path, capsys, monkeypatch):
    from loaderdoctor.cli import main

    monkeypatch.setenv("LOADERDOCTOR_HOME", str(tmp_path))
    with History() as history:
        history.add(make_run(started_at=_stamp(1)))
    db = sqlite3.connect(tmp_path / "history.sqlite3")
    with db:
        rest = json.dumps({"host": {}, "settings": {}, "measurements": "fast", "findings": []})
        db.execute("INSERT INTO runs VALUES (2, 'x', 'watch', ?, ?, ?)", (_stamp(2), _stamp(3), rest))
    db.close()
    assert main(["history"]) == 0
    assert main(["report", "2"]) == 1  # a clear error, the history damaged: no usage error
    err = capsys.readouterr().err
    assert "run 2 in the history" in err and "measurements is str, not dict" in err
    assert "Traceback" not in err
