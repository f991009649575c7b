"""The history's SQLite database: where it lives, its versioned schema, and RunRecords written and read safely by
many processes at once."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import stat
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from loaderdoctor.errors import LoaderDoctorError, LoaderDoctorWarning
from loaderdoctor.history.records import RunRecord, parse_iso

log = logging.getLogger("loaderdoctor")

FILE_NAME = "history.sqlite3"
# How long a writer waits for the others (ranks, jobs sharing one history) before it gives up.
BUSY_TIMEOUT_S = 30.0
# The fields kept as columns, to filter and sort on; the rest of a RunRecord is one JSON text, `record`.
_COLUMNS = ("name", "kind", "started_at", "ended_at")
_SELECT = f"SELECT id, {', '.join(_COLUMNS)}, record FROM runs"


class HistoryWarning(LoaderDoctorWarning):
    """A run could not be saved to the history: training goes on, the run is not kept."""


def history_path() -> Path:
    """Where the history lives: $LOADERDOCTOR_HOME/history.sqlite3, else in the user's XDG data directory."""
    if home := os.environ.get("LOADERDOCTOR_HOME"):
        return Path(home).expanduser() / FILE_NAME
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home).expanduser() / "loaderdoctor" / FILE_NAME


def _create_runs(db: sqlite3.Connection) -> None:
    """Version 1: one row per run."""
    db.execute(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT NOT NULL, kind TEXT NOT NULL, "
        "started_at TEXT NOT NULL, ended_at TEXT NOT NULL, record TEXT NOT NULL)"
    )
    db.execute("CREATE INDEX runs_by_name ON runs (name)")


# The schema's versions in order: MIGRATIONS[i] takes a database from version i to version i + 1, in one
# transaction. A new version is one function appended here; never change one that has shipped.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_create_runs]
SCHEMA_VERSION = len(MIGRATIONS)


def _private_file(path: Path) -> None:
    """The database file readable by this user alone (0600), made so before SQLite opens it: its -wal and -shm
    files take the same mode. A file of an earlier version, made 0644, is narrowed when it is this user's."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        return
    except FileExistsError:
        pass
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(OSError):  # gone meanwhile, or a read-only mount: read as it is
            found = os.lstat(name)
            if stat.S_ISREG(found.st_mode) and found.st_uid == os.getuid() and found.st_mode & 0o077:
                os.chmod(name, 0o600)


# What SQLite says when a read-only connection cannot make or map the WAL's -shm file (a read-only mount, a full
# disk): the database is then read as immutable.
_NO_SHM = ("SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_IOERR_SHM")


class History:
    """The run history in one SQLite database, open until close(): created (folder included) when missing and
    brought to the current schema. Each process (each rank) opens its own; writes wait for each other.
    With read_only, an existing history is opened for reading alone (see _open_read_only): nothing is made or
    changed, so that a history on a read-only mount or a full disk can still be read."""

    def __init__(self, path: Path | None = None, *, timeout_s: float = BUSY_TIMEOUT_S, read_only: bool = False) -> None:
        self.path = history_path() if path is None else Path(path)
        self.timeout_s = timeout_s
        self.read_only = read_only
        self.version = SCHEMA_VERSION
        if read_only:
            self._db = self._open_read_only()
            return
        try:
            self.path.parent.parent.mkdir(parents=True, exist_ok=True)
            self.path.parent.mkdir(mode=0o700, exist_ok=True)  # its runs name other processes: this user's only
            _private_file(self.path)
        except OSError as error:
            blocking = next((p for p in (self.path.parent, *self.path.parent.parents) if p.is_file()), None)
            why = f"{blocking} is a file, not a folder" if blocking else error.strerror or str(error)
            raise LoaderDoctorError(
                f"cannot create the history's folder {self.path.parent}: {why}",
                hint="set LOADERDOCTOR_HOME to a folder you can write to",
            ) from None
        with self._translated():
            # isolation_level=None: no hidden transactions; every write says BEGIN IMMEDIATE itself
            self._db = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        try:
            with self._translated():
                self._use_wal()
                self._migrate()
        except BaseException:
            self._db.close()
            raise

    def add(self, run: RunRecord) -> int:
        """Save `run` as a new row; return its id, which is set on the run as well."""
        for moment in (run.started_at, run.ended_at):
            parse_iso(moment)  # a time that is no ISO 8601 is the caller's mistake: ValueError now, not a bad row
        record = {key: value for key, value in run.to_dict().items() if key != "id" and key not in _COLUMNS}
        text = json.dumps(_finite(record), allow_nan=False)
        with self._translated(), self._write():
            cursor = self._db.execute(
                f"INSERT INTO runs ({', '.join(_COLUMNS)}, record) VALUES (?, ?, ?, ?, ?)",
                (run.name, run.kind, run.started_at, run.ended_at, text),
            )
        assert cursor.lastrowid is not None
        run.id = cursor.lastrowid
        return run.id

    def runs(self, name: str | None = None, kind: str | None = None, limit: int | None = None) -> list[RunRecord]:
        """The runs (of this name, of this kind), newest first; at most `limit` of them."""
        where, values = [], []
        for column, value in (("name", name), ("kind", kind)):
            if value is not None:
                where.append(f"{column} = ?")
                values.append(value)
        sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "")
        # julianday: the moment whatever zone the text was written in; id orders runs that started together
        sql += " ORDER BY julianday(started_at) DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            values.append(limit)
        if self.version == 0:  # made, never written: no table yet
            return []
        with self._translated():
            rows = self._db.execute(sql, values).fetchall()
        runs = []
        for row in rows:
            try:
                runs.append(self._record(row))
            except LoaderDoctorError as error:  # one unreadable run hides no other
                log.warning("%s (%s)", error.message, error.hint)
        return runs

    def get(self, run_id: int) -> RunRecord | None:
        """The run of this id, or None."""
        if self.version == 0:
            return None
        with self._translated():
            row = self._db.execute(_SELECT + " WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else self._record(row)

    def latest(self) -> RunRecord | None:
        """The newest run, or None in an empty history."""
        newest = self.runs(limit=1)
        return newest[0] if newest else None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _record(self, row: tuple[Any, ...]) -> RunRecord:
        run_id, name, kind, started_at, ended_at, record = row
        try:
            rest = json.loads(record)
            return RunRecord.from_dict(
                {**rest, "id": run_id, "name": name, "kind": kind, "started_at": started_at, "ended_at": ended_at}
            )
        except (TypeError, ValueError) as error:  # damaged, or written by a newer loaderdoctor (a new kind)
            raise LoaderDoctorError(
                f"run {run_id} in the history at {self.path} cannot be read: {error}",
                hint="it is damaged, or a newer loaderdoctor wrote it: upgrade loaderdoctor to read it",
            ) from None

    def _open_read_only(self) -> sqlite3.Connection:
        """The database opened read-only (mode=ro), its schema version read; where even that fails because SQLite
        cannot make the WAL's -shm file beside it (a read-only mount, a full disk), opened as immutable, which
        needs no -shm: nobody can be writing to a folder where no file can be made. Only a WAL left by a writer
        that died is then not read (its runs were not checkpointed); a WAL with its -shm is read by mode=ro."""
        uri = self.path.absolute().as_uri()  # the path's odd characters (?, #, %) escaped
        for query in ("mode=ro", "mode=ro&immutable=1"):
            db = None
            try:
                db = sqlite3.connect(f"{uri}?{query}", uri=True, timeout=self.timeout_s, isolation_level=None)
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the first read: opens the WAL
                self.version = int(db.execute("PRAGMA user_version").fetchone()[0])
            except sqlite3.Error as error:
                if db is not None:
                    db.close()
                if "immutable" not in query and getattr(error, "sqlite_errorname", "").startswith(_NO_SHM):
                    continue
                raise self._failure(error) from None
            if self.version > SCHEMA_VERSION:
                db.close()
                raise self._too_new(self.version)
            return db
        raise AssertionError("unreachable: the immutable open raises or returns")

    def _use_wal(self) -> None:
        """Write-ahead logging, so that readers never block the writer and writers only queue behind each other.
        The mode stays with the file: set once, by whichever process comes first."""
        mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]
        if mode.lower() != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")

    def _migrate(self) -> None:
        """Bring the schema to SCHEMA_VERSION, one migration per transaction; refuse a newer schema."""
        version = self._version()
        if version > SCHEMA_VERSION:
            raise self._too_new(version)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._write():
                current = self._version()  # another process may have migrated while this one waited
                if current >= target:
                    continue
                MIGRATIONS[target - 1](self._db)
                self._db.execute(f"PRAGMA user_version = {target}")

    def _version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an error): the write lock taken first, so that writers queue on
        the busy timeout instead of failing when a read lock cannot be upgraded halfway."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """sqlite3's errors as LoaderDoctorErrors that say what failed, where, and what to do."""
        try:
            yield
        except sqlite3.Error as error:
            raise self._failure(error) from None

    def _failure(self, error: sqlite3.Error) -> LoaderDoctorError:
        code = getattr(error, "sqlite_errorname", "") or ""
        if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return LoaderDoctorError(
                f"the history at {self.path} stayed locked by another process for over {self.timeout_s:g} s",
                hint="let the other loaderdoctor runs finish, or set LOADERDOCTOR_HOME to another folder",
            )
        if code.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
            return self._corrupt(str(error))
        if self.read_only and code.startswith(("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_IOERR")):
            return LoaderDoctorError(
                f"cannot read the history at {self.path}: {error}",
                hint="check that it is a file you can read, or set LOADERDOCTOR_HOME to another folder",
            )
        if code.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_PERM", "SQLITE_FULL", "SQLITE_IOERR")):
            return LoaderDoctorError(
                f"cannot write the history at {self.path}: {self._unwritable() or error}",
                hint="set LOADERDOCTOR_HOME to a folder you can write to, with space left",
            )
        return LoaderDoctorError(
            f"the history at {self.path} failed: {error}",
            hint="set LOADERDOCTOR_HOME to another folder to start a new history",
        )

    def _unwritable(self) -> str | None:
        """Why the history cannot be written, in the system's words ("Read-only file system"), where the file, its
        folder or its disk says so; None where they look writable (SQLite's own message then says more)."""
        try:
            os.close(os.open(self.path, os.O_RDWR | os.O_NOFOLLOW))
        except OSError as error:
            return error.strerror or str(error)
        if not os.access(self.path.parent, os.W_OK):
            return f"its folder {self.path.parent} is not writable"
        with contextlib.suppress(OSError):
            if os.statvfs(self.path.parent).f_bavail == 0:
                return "no space left on its disk"
        return None

    def _too_new(self, version: int) -> LoaderDoctorError:
        return LoaderDoctorError(
            f"history at {self.path} has schema version {version}; this loaderdoctor knows up to {SCHEMA_VERSION}",
            hint="upgrade loaderdoctor or set LOADERDOCTOR_HOME to another folder",
        )

    def _corrupt(self, what: str) -> LoaderDoctorError:
        return LoaderDoctorError(
            f"the history at {self.path} is damaged: {what}",
            hint=f"move it aside (mv {self.path} {self.path}.broken): loaderdoctor then starts a new history",
        )


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity made None: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def save_run(run: RunRecord, path: Path | None = None, *, timeout_s: float = BUSY_TIMEOUT_S) -> int | None:
    """Add `run` to the history and return its id; for code inside a training run, which this must never
    crash: any failure is one HistoryWarning (what, where, what to do) and None."""
    where = history_path() if path is None else Path(path)
    try:
        with History(where, timeout_s=timeout_s) as history:
            return history.add(run)
    except LoaderDoctorError as error:
        reason = error.message + (f"; {error.hint}" if error.hint else "")
    except Exception as error:  # never the training run's end: a bug here costs the record, not the run
        reason = f"{type(error).__name__}: {error} (history at {where})"
    warnings.warn(f"loaderdoctor did not save the {run.kind} run '{run.name}': {reason}", HistoryWarning, stacklevel=2)
    return None


def load_runs(
    name: str | None = None, kind: str | None = None, limit: int | None = None, path: Path | None = None
) -> list[RunRecord]:
    """The history's runs, newest first (see History.runs); none where no history was written yet, without
    creating one. Raises LoaderDoctorError (with a hint) for a history that cannot be read."""
    where = history_path() if path is None else Path(path)
    if not where.exists():
        return []
    with _reader(where) as history:
        return history.runs(name=name, kind=kind, limit=limit)


def load_run(run_id: int, path: Path | None = None) -> RunRecord | None:
    """The run of this id, or None (also where no history was written yet)."""
    where = history_path() if path is None else Path(path)
    if not where.exists():
        return None
    with _reader(where) as history:
        return history.get(run_id)


def _reader(where: Path) -> History:
    """The history at `where` opened for reading, read-only (a read-only mount or a full disk can be read); one
    of an older schema is opened for writing instead, to be brought up to date first."""
    history = History(where, read_only=True)
    if 0 < history.version < SCHEMA_VERSION:
        history.close()
        return History(where)
    return history
