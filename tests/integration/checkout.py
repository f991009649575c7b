"""The environment for a subprocess of a test: this checkout's loaderdoctor on PYTHONPATH, and nothing else of the
test process's sys.path (a test that ran before in the same process may have put a folder of its own there, a
target's, whose pipeline.py would take another's name)."""

from __future__ import annotations

import os
from pathlib import Path

import loaderdoctor


def checkout_env(**more: str) -> dict[str, str]:
    """os.environ with PYTHONPATH set to the folder that holds this checkout's package, and `more`."""
    source = str(Path(loaderdoctor.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": source, **more}
