"""Whose code a frame runs, and the user's frame of a traceback: one classification for stacks and errors."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch.utils.data.dataloader

import loaderdoctor
import loaderdoctor.loader.settings
from loaderdoctor.plain.usercode import code_owner, describe_exception, innermost_user_frame

OWN_FILE = loaderdoctor.loader.settings.__file__
PACKAGE_DIR = os.path.dirname(loaderdoctor.__file__)
SCENARIO_FILE = os.path.join(PACKAGE_DIR, "scenarios", "demo.py")
TORCH_FILE = torch.utils.data.dataloader.__file__


def test_code_owners():
    assert code_owner("/tmp/user_pipeline/dataset.py") == "user"
    assert code_owner(__file__) == "user"
    assert code_owner(SCENARIO_FILE) == "user"  # the built-in scenarios play the user's part
    assert code_owner(threading.__file__) == "python"
    assert code_owner(pytest.__file__) == "package"
    assert code_owner("/opt/venv/lib/python3.11/site-packages/tqdm/_monitor.py") == "package"
    assert code_owner(OWN_FILE) == "internal"
    assert code_owner(TORCH_FILE) == "internal"
    assert code_owner("<frozen importlib._bootstrap>") == "internal"


def test_every_module_of_every_folder_of_the_package_is_its_own_code_but_the_scenarios():
    """Anchored on the package's root, not on the folder of the module that asks."""
    modules = sorted(Path(PACKAGE_DIR).rglob("*.py"))
    assert len({path.parent for path in modules}) > 10
    for path in modules:
        expected = "user" if "scenarios" in path.relative_to(PACKAGE_DIR).parts else "internal"
        assert code_owner(str(path)) == expected, path


def _user_calls_the_standard_library() -> None:
    json.loads("{")


def test_the_users_frame_comes_before_the_libraries_it_called():
    with pytest.raises(json.JSONDecodeError) as caught:
        _user_calls_the_standard_library()
    frame = innermost_user_frame(caught.value.__traceback__)
    assert frame is not None and frame[0] == __file__ and frame[2] == "_user_calls_the_standard_library"
    assert describe_exception(caught.value).endswith("in _user_calls_the_standard_library)")


def test_without_a_traceback_there_is_no_frame():
    assert innermost_user_frame(None) is None
