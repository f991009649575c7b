"""The lock-contention scenario's shared file is written only into a private folder of this user's: a folder
another user made first, or a link planted in its place, is refused, never written through."""

from __future__ import annotations

import os

import numpy as np
import pytest

from loaderdoctor.errors import UsageError
from loaderdoctor.scenarios.lock_contention import POSE_FLOATS, private_folder, shared_pose_file


def test_the_pose_file_is_made_once_in_a_folder_of_mode_0700(tmp_path):
    path = shared_pose_file(16, parent=str(tmp_path))
    folder = os.path.dirname(path)
    assert os.path.basename(folder) == f"loaderdoctor-scenarios-{os.getuid()}"
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert np.fromfile(path, dtype=np.float32).shape == (16 * POSE_FLOATS,)
    assert shared_pose_file(16, parent=str(tmp_path)) == path
    assert [name for name in os.listdir(folder) if name.endswith(".partial")] == []


def test_a_link_planted_where_the_folder_goes_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (tmp_path / f"loaderdoctor-scenarios-{os.getuid()}").symlink_to(victim)
    with pytest.raises(UsageError, match="not a private folder"):
        shared_pose_file(16, parent=str(tmp_path))
    assert list(victim.iterdir()) == []


def test_a_folder_open_to_others_is_refused(tmp_path):
    folder = tmp_path / f"loaderdoctor-scenarios-{os.getuid()}"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(UsageError, match="not a private folder"):
        private_folder("loaderdoctor-scenarios", str(tmp_path))
