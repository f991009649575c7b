"""The folders loaderdoctor makes in TMPDIR: private, marked with the process that owns them, removed by it, and
swept by a later run when that process was killed before it could remove them."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

# Every folder of the tool's is named loaderdoctor-KIND-XXXXXXXX; the marker inside names its owner process.
PREFIX = "loaderdoctor-"
OWNER_FILE = ".loaderdoctor-owner"
_MARKER_MAX_BYTES = 200

_made: set[str] = set()  # the folders this process made and has not removed yet
_swept = False  # whether this process swept the stale folders of TMPDIR already


def make_private_folder(prefix: str) -> str:
    """A new folder in TMPDIR named `prefix`XXXXXXXX (a PREFIX name), mode 0700, marked as this process's. The first
    time a process makes one, the folders that killed runs left are swept first (see sweep_stale)."""
    global _swept
    if not prefix.startswith(PREFIX):
        raise ValueError(f"loaderdoctor's folders are named {PREFIX}..., not {prefix}...")
    if not _swept:
        _swept = True
        sweep_stale()
    path = tempfile.mkdtemp(prefix=prefix)  # mode 0700, a name nobody could have taken before
    try:
        descriptor = os.open(
            os.path.join(path, OWNER_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
        )
        with os.fdopen(descriptor, "w") as marker:
            marker.write(_owner_marker(os.getpid()) or "")
        _made.add(path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def remove_folder(path: str | os.PathLike[str]) -> None:
    """Remove a folder make_private_folder made, and all it holds."""
    shutil.rmtree(path, ignore_errors=True)
    _made.discard(str(path))


def remove_made() -> None:
    """Remove every folder this process made and has not removed yet: at the end of a command, whatever stopped
    it (an exception between a folder's making and the code that would remove it, a signal)."""
    for path in list(_made):
        if _owner(Path(path)) == _owner_marker(os.getpid()):  # not a folder a parent made before forking this one
            remove_folder(path)


def sweep_stale(parent: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove the folders in `parent` (default TMPDIR) that a process of loaderdoctor's made and that outlived it
    (the process was SIGKILLed): named PREFIX..., real folders (not symlinks) owned by this user, whose marker names
    a process of this machine's pid namespace that no longer runs (same pid, same start time). Anything else is
    left as it is: another user's folder, a folder without a marker, one whose owner runs. The paths removed."""
    parent = Path(tempfile.gettempdir() if parent is None else parent)
    removed = []
    try:
        entries = [entry.name for entry in os.scandir(parent) if entry.name.startswith(PREFIX)]
    except OSError:
        return removed
    for name in entries:
        path = parent / name
        marker = _owner(path)
        if marker is not None and _owner_gone(marker):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def _owner(path: Path) -> str | None:
    """The owner marker of a folder of this user's at `path` (never followed through a symlink), or None."""
    try:
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None  # gone, a symlink, not a folder, or not ours to read
    try:
        if os.fstat(folder).st_uid != os.getuid():
            return None
        try:
            descriptor = os.open(OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError:
            return None
        with os.fdopen(descriptor, "rb") as marker:
            info = os.fstat(marker.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                return None
            return marker.read(_MARKER_MAX_BYTES).decode("ascii", errors="replace")
    finally:
        os.close(folder)


def _owner_marker(pid: int) -> str | None:
    """What marks a folder as process `pid`'s: its pid, its start time (pids are reused) and its pid namespace
    (another container's pid says nothing here); None when the process does not run."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        started = fields[19]  # the 22nd field of stat: the process's start time, in clock ticks since boot
    except FileNotFoundError:
        return None
    except (OSError, IndexError):  # no /proc here: the pid alone
        started = "-"
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    namespace = "-"
    with contextlib.suppress(OSError):
        namespace = os.readlink(f"/proc/{os.getpid()}/ns/pid")
    return f"{pid} {started} {namespace}\n"


def _owner_gone(marker: str) -> bool:
    """Whether the process a marker names has ended (a marker of another pid namespace, or unreadable: no)."""
    try:
        pid_text, _started, namespace = marker.split()
        pid = int(pid_text)
    except ValueError:
        return False
    ours = _owner_marker(os.getpid())
    if pid <= 0 or ours is None or namespace != ours.split()[2]:
        return False
    return _owner_marker(pid) != marker
