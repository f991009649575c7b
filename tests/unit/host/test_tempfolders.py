"""The tool's folders in TMPDIR: private and marked with their owner; those a killed run left are swept by the next,
and nothing else is: a live owner's, an unmarked one, another user's, a symlink."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from loaderdoctor.host import tempfolders
from loaderdoctor.host.tempfolders import OWNER_FILE, make_private_folder, remove_folder, remove_made, sweep_stale

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tmpdir_here(tmp_path, monkeypatch):
    """TMPDIR is `tmp_path` for tempfile, and this process has not swept it yet."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tempfolders, "_swept", False)
    return tmp_path


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _folder_of(parent: Path, name: str, marker: str | None) -> Path:
    folder = parent / name
    folder.mkdir(mode=0o700)
    (folder / "a-worker-file.txt").write_text("left by the run")
    if marker is not None:
        (folder / OWNER_FILE).write_text(marker)
    return folder


def _marker_of(pid: int) -> str:
    """The marker a process with `pid` would write, as if it ran in this pid namespace."""
    ours = tempfolders._owner_marker(os.getpid())
    assert ours is not None
    namespace = ours.split()[2]
    return f"{pid} 12345 {namespace}\n"


def test_a_folder_is_private_marked_and_removed_by_its_owner(tmpdir_here):
    path = make_private_folder("loaderdoctor-stacks-")
    assert Path(path).parent == tmpdir_here and Path(path).name.startswith("loaderdoctor-stacks-")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert tempfolders._owner(Path(path)) == tempfolders._owner_marker(os.getpid())
    assert sweep_stale() == []  # its owner runs: not stale
    remove_folder(path)
    assert not os.path.exists(path)


def test_remove_made_removes_what_an_interrupted_owner_did_not(tmpdir_here):
    kept_by_nobody = make_private_folder("loaderdoctor-scale-")
    removed = make_private_folder("loaderdoctor-stacks-")
    remove_folder(removed)
    remove_made()
    assert not os.path.exists(kept_by_nobody) and list(tmpdir_here.iterdir()) == []


def test_only_the_tools_own_names_are_made():
    with pytest.raises(ValueError):
        make_private_folder("pymp-")


@pytest.mark.workers
def test_a_dead_owners_folder_is_swept_and_nothing_else(tmp_path):
    dead = _dead_pid()
    stale = _folder_of(tmp_path, "loaderdoctor-stacks-dead", _marker_of(dead))
    live = _folder_of(tmp_path, "loaderdoctor-stacks-live", tempfolders._owner_marker(os.getpid()))
    reused_pid = _folder_of(tmp_path, "loaderdoctor-stacks-reused", _marker_of(os.getpid()))  # other start time
    unmarked = _folder_of(tmp_path, "loaderdoctor-stacks-unmarked", None)
    other_name = _folder_of(tmp_path, "someone-else-dead", _marker_of(dead))
    other_namespace = _folder_of(tmp_path, "loaderdoctor-stacks-container", f"{dead} 12345 pid:[1]\n")
    garbage = _folder_of(tmp_path, "loaderdoctor-stacks-garbage", "not a marker")

    removed = sweep_stale(tmp_path)

    assert sorted(removed) == sorted([str(stale), str(reused_pid)])
    assert not stale.exists() and not reused_pid.exists()
    for kept in (live, unmarked, other_name, other_namespace, garbage):
        assert (kept / "a-worker-file.txt").exists(), kept


@pytest.mark.workers
def test_a_symlink_to_a_stale_looking_folder_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = _folder_of(elsewhere, "victim", _marker_of(_dead_pid()))
    (tmp_path / "loaderdoctor-stacks-link").symlink_to(target, target_is_directory=True)
    # and a marker that is itself a symlink to a file that would look stale
    linked_marker = _folder_of(tmp_path, "loaderdoctor-stacks-markerlink", None)
    (elsewhere / "marker").write_text(_marker_of(_dead_pid()))
    (linked_marker / OWNER_FILE).symlink_to(elsewhere / "marker")

    assert sweep_stale(tmp_path) == []
    assert (target / "a-worker-file.txt").exists() and (tmp_path / "loaderdoctor-stacks-link").is_symlink()
    assert (linked_marker / "a-worker-file.txt").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder that belongs to another user")
@pytest.mark.workers
def test_another_users_folder_is_not_touched(tmp_path):
    theirs = _folder_of(tmp_path, "loaderdoctor-stacks-theirs", _marker_of(_dead_pid()))
    os.chown(theirs, 65534, 65534)
    os.chown(theirs / OWNER_FILE, 65534, 65534)
    ours_but_their_marker = _folder_of(tmp_path, "loaderdoctor-stacks-forged", _marker_of(_dead_pid()))
    os.chown(ours_but_their_marker / OWNER_FILE, 65534, 65534)

    assert sweep_stale(tmp_path) == []
    assert (theirs / "a-worker-file.txt").exists() and (ours_but_their_marker / "a-worker-file.txt").exists()


@pytest.mark.workers
def test_a_process_killed_with_its_folder_has_it_swept_by_the_next_one(tmp_path):
    environ = {**os.environ, "TMPDIR": str(tmp_path)}
    make = (
        "from loaderdoctor.host.tempfolders import make_private_folder as m; "
        "print(m('loaderdoctor-stacks-'), flush=True)"
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", make + "; import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True, env=environ
    )
    try:
        left = Path(killed.stdout.readline().strip())
    finally:
        killed.kill()
        killed.wait()
        killed.stdout.close()
    assert left.is_dir()  # SIGKILL: nothing could remove it

    after = subprocess.run([sys.executable, "-c", make], capture_output=True, text=True, env=environ, check=True)

    assert not left.exists()
    assert [path.name for path in tmp_path.iterdir()] == [Path(after.stdout.strip()).name]  # its own, left too
