"""A history that cannot be written can still be read: on a read-only mount, on a full disk, or where SQLite cannot
make the WAL's -shm file; writing to one is a one-line HistoryWarning that says the run was not kept and why."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_history import _stamp, make_run

from loaderdoctor.cli import main
from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.history import store
from loaderdoctor.history.keep import keep_run
from loaderdoctor.history.store import FILE_NAME, History, HistoryWarning, load_run, load_runs, save_run


def _written(folder: Path, runs: int = 2) -> Path:
    """A history in `folder` written the normal way and closed (no -wal, no -shm left): its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    for minute in range(1, runs + 1):
        assert save_run(make_run(started_at=_stamp(minute), rate=10.0 * minute), path) == minute
    assert sorted(p.name for p in folder.iterdir()) == [FILE_NAME]
    return path


def _mount(*words: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *words], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def _mounted(*words: str, at: Path) -> Iterator[None]:
    """`mount WORDS AT` for the block; the test is skipped, with mount's reason, where mounting is not allowed."""
    at.mkdir(exist_ok=True)
    done = _mount(*words, str(at))
    if done.returncode != 0:
        pytest.skip(f"a real mount needs root where mount is permitted: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(at)], capture_output=True, timeout=30, check=True)


@contextlib.contextmanager
def _read_only_view(folder: Path, at: Path) -> Iterator[Path]:
    """`folder` seen read-only at `at` (a read-only bind mount: root ignores file modes, not a read-only mount)."""
    with _mounted("--bind", str(folder), at=at):
        if _mount("-o", "remount,ro,bind", str(at)).returncode != 0:
            pytest.skip("this mount namespace cannot make a bind mount read-only")
        yield at / FILE_NAME


@pytest.mark.workers
def test_a_history_on_a_read_only_mount_is_read_and_a_write_says_why_it_was_not_kept(tmp_path):
    written = _written(tmp_path / "home")
    with _read_only_view(written.parent, tmp_path / "ro") as path:
        assert [run.measurements["batches_per_s"] for run in load_runs(path=path)] == [20.0, 10.0]
        assert load_run(1, path=path) == load_runs(path=path)[1]
        with pytest.warns(HistoryWarning) as caught:
            assert keep_run(make_run(started_at=_stamp(3)), path) is None
        (warning,) = caught  # the comparison read the history: only the save failed
        message = str(warning.message)
        assert message.startswith("loaderdoctor did not save the check run 'resnet': cannot write the history")
        assert "Read-only file system" in message and "\n" not in message
        assert sorted(p.name for p in path.parent.iterdir()) == [FILE_NAME]  # nothing could be made there
    assert len(load_runs(path=written)) == 2  # nothing lost


@pytest.mark.workers
def test_history_compare_and_report_read_a_history_on_a_read_only_mount(tmp_path, monkeypatch, capsys):
    written = _written(tmp_path / "home")
    with _read_only_view(written.parent, tmp_path / "ro") as path:
        monkeypatch.setenv("LOADERDOCTOR_HOME", str(path.parent))
        for argv in (["history"], ["history", "compare", "1", "2"], ["report", "2"], ["history", "show", "1"]):
            assert main(argv) == 0, argv
            captured = capsys.readouterr()
            assert "error" not in captured.err and "resnet" in captured.out, argv


@pytest.mark.workers
def test_a_history_on_a_full_disk_is_read_and_a_write_says_the_disk_is_full(tmp_path):
    disk = tmp_path / "disk"
    with _mounted("-t", "tmpfs", "-o", "size=256k", "tmpfs", at=disk):
        path = _written(disk)
        with contextlib.suppress(OSError), (disk / "filler").open("wb", buffering=0) as filler:
            while True:  # until the disk is full
                filler.write(b"x" * 4096)
        assert [run.id for run in load_runs(path=path)] == [2, 1]
        with pytest.warns(HistoryWarning, match="did not save the check run 'resnet': cannot write the history"):
            assert save_run(make_run(started_at=_stamp(3)), path) is None


def test_where_the_read_only_open_cannot_open_the_history_it_is_read_as_immutable(tmp_path, monkeypatch):
    """Without a mount (the tests above need one): SQLite's read-only open fails with its real SQLITE_CANTOPEN, as
    it does where it cannot make the -shm file; the immutable open that follows reads every run."""
    path = _written(tmp_path)
    real_connect, tried = sqlite3.connect, []

    def connect(database: str, **options: object) -> sqlite3.Connection:
        tried.append(database.rpartition("?")[2])
        if "immutable" not in database:
            database = f"{(tmp_path / 'missing' / FILE_NAME).as_uri()}?mode=ro"  # cannot be opened
        return real_connect(database, **options)

    monkeypatch.setattr(store.sqlite3, "connect", connect)
    assert [run.id for run in load_runs(path=path)] == [2, 1]
    assert tried == ["mode=ro", "mode=ro&immutable=1"]


def test_reading_changes_nothing_in_the_database(tmp_path):
    path = _written(tmp_path)
    os.chmod(path, 0o644)  # the narrowing to 0600 is a writer's job
    before = path.read_bytes()
    with History(path, read_only=True) as history:
        assert len(history.runs()) == 2
        with pytest.raises(LoaderDoctorError, match=r"cannot write the history|readonly"):
            history.add(make_run())
    assert path.read_bytes() == before
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_a_database_made_but_never_written_reads_as_empty(tmp_path):
    path = tmp_path / FILE_NAME
    db = sqlite3.connect(path)
    db.execute("VACUUM")  # a valid, empty database file: version 0, no table
    db.close()
    assert load_runs(path=path) == []
    assert load_run(1, path=path) is None


def test_a_newer_schema_is_refused_when_read_read_only(tmp_path):
    path = _written(tmp_path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 5")
    db.commit()
    db.close()
    with pytest.raises(LoaderDoctorError, match="has schema version 5; this loaderdoctor knows up to 1"):
        load_runs(path=path)


def test_reading_an_older_schema_brings_it_up_to_date_first(tmp_path, monkeypatch):
    path = _written(tmp_path)
    added = []
    monkeypatch.setattr(store, "MIGRATIONS", [*store.MIGRATIONS, lambda db: added.append(1)])
    monkeypatch.setattr(store, "SCHEMA_VERSION", 2)
    assert len(load_runs(path=path)) == 2
    assert added == [1]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    db.close()
