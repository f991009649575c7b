"""Whose code a frame runs, and the user's frame of a traceback: one classification for stacks and errors."""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch.utils.data.dataloader

import loaderdoctor.settings
from loaderdoctor.usercode import code_owner, describe_exception, innermost_user_frame

OWN_FILE = loaderdoctor.settings.__file__
SCENARIO_FILE = os.path.join(os.path.dirname(OWN_FILE), "scenarios", "demo.py")
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
