"""What the benchmarks run in fresh processes: the scripts they write for it, `loaderdoctor check`'s and
`loaderdoctor run`'s JSON reports, and the figure a plain loop's process prints last."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def script_folder(prefix: str, name: str, text: str) -> Iterator[Path]:
    """A temporary folder holding the script `name` (a training script the benchmark runs, with its own files
    beside it), removed at the block's end; the script's path."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        script = Path(folder) / name
        script.write_text(text)
        yield script


def check_json(target: str, options: Sequence[str], timeout_s: float, **run: Any) -> dict[str, Any]:
    """The report of `loaderdoctor check TARGET --json OPTIONS` run in a fresh process (exit status 0, or 1 for a
    critical finding); any other status ends the benchmark with check's error."""
    command = [sys.executable, "-m", "loaderdoctor", "check", target, "--json", *options]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, **run)
    if result.returncode not in (0, 1):
        raise SystemExit(f"check {target} failed with status {result.returncode}:\n{result.stderr}")
    return json.loads(result.stdout)


def run_json(arguments: Sequence[str], out: Path, timeout_s: float, **run: Any) -> dict[str, Any]:
    """The report of `loaderdoctor run --json OUT --no-history ARGUMENTS` (its options, then the script and its
    arguments) run in a fresh process; a run that writes none ends the benchmark with its error."""
    out.unlink(missing_ok=True)  # an earlier round's
    command = [sys.executable, "-m", "loaderdoctor", "run", "--json", str(out), "--no-history", *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, **run)
    if not out.exists():
        raise SystemExit(f"loaderdoctor run wrote no JSON: {result.stderr[-800:]}")
    return json.loads(out.read_text())


def figure_in_fresh_process(command: Sequence[str], timeout_s: float, **run: Any) -> Any:
    """What a fresh process running `command` prints last (its last line, read as JSON), or None when it runs past
    `timeout_s` (a hang); a process that fails ends the benchmark with its error."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, **run)
    except subprocess.TimeoutExpired:
        return None
    if result.returncode != 0:
        shown = " ".join(map(str, command))[:200]
        raise SystemExit(f"{shown} failed with status {result.returncode}:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])
