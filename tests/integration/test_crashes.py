"""A loader that crashes is never a healthy report: `check` on real workers that segfault, are killed, cannot load
the dataset under spawn, or whose worker_init_fn raises exits 1 with a critical worker-crash that names the cause
(the signal, the dataset index held, the class spawn cannot import, the worker_init_fn's frame)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from checkout import checkout_env

pytestmark = [pytest.mark.workers, pytest.mark.timeout(120)]

PIPELINES = textwrap.dedent(
    """
    import ctypes
    import os
    import signal

    import torch
    from torch.utils.data import DataLoader, Dataset


    class Plain(Dataset):
        def __len__(self):
            return 256

        def __getitem__(self, index):
            return torch.full((16,), float(index))


    class SegfaultsAt37(Plain):
        def __getitem__(self, index):
            if index == 37:
                ctypes.string_at(0)  # reads address 0: SIGSEGV in native code
            return super().__getitem__(index)


    class KilledAt37(Plain):
        def __getitem__(self, index):
            if index == 37:
                os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer ends a worker
            return super().__getitem__(index)


    def open_config(worker_id):
        raise FileNotFoundError("no such file: /etc/pipeline.yaml")


    def segfault():
        return DataLoader(SegfaultsAt37(), batch_size=8, num_workers=2)


    def killed():
        return DataLoader(KilledAt37(), batch_size=8, num_workers=2, persistent_workers=True)


    def bad_init():
        return DataLoader(Plain(), batch_size=8, num_workers=2, worker_init_fn=open_config)
    """
)


def _env() -> dict[str, str]:
    return checkout_env()


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("crashes") / "pipelines.py"
    path.write_text(PIPELINES)
    return path


def _check(target: str, cwd: Path) -> tuple[int, dict]:
    command = [sys.executable, "-m", "loaderdoctor", "check", target, "--json", "--budget", "15"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100, env=_env(), cwd=cwd)
    assert result.returncode in (0, 1) and result.stdout.startswith("{"), result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout)


def _main_finding(report: dict) -> dict:
    (loader,) = report["loaders"].values()
    assert loader["findings"], "a crashed loader reported no problem"
    return loader["findings"][0]


@pytest.mark.parametrize(
    ("target", "signal_name"),
    [("segfault", "SIGSEGV"), ("killed", "SIGKILL")],
)
def test_a_worker_killed_at_one_sample_is_a_critical_crash_naming_the_signal_and_the_sample(
    pipelines, target, signal_name
):
    status, report = _check(f"{pipelines}:{target}", pipelines.parent)
    assert status == 1
    finding = _main_finding(report)
    assert finding["rule"] == "worker-crash"
    assert finding["severity"] == "critical"
    assert finding["evidence"]["signal"] == signal_name
    assert finding["evidence"]["index"] == 37
    assert "dataset[37]" in finding["title"]
    assert finding["evidence"]["pid"] is not None


def test_a_worker_init_fn_that_raises_is_named_with_its_frame_not_as_bad_samples(pipelines):
    status, report = _check(f"{pipelines}:bad_init", pipelines.parent)
    assert status == 1
    finding = _main_finding(report)
    assert finding["rule"] == "worker-crash"
    assert finding["severity"] == "critical"
    error = finding["evidence"]["worker_init_error"]
    assert error.startswith("FileNotFoundError: no such file: /etc/pipeline.yaml")
    assert "pipelines.py:" in error and "in open_config" in error
    (loader,) = report["loaders"].values()
    assert "sample-errors" not in [f["rule"] for f in loader["findings"]]


NOTEBOOK = textwrap.dedent(
    """
    import json

    import torch
    from torch.utils.data import DataLoader, Dataset

    import loaderdoctor


    class DefinedInTheNotebook(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, index):
            return torch.zeros(4)


    loader = DataLoader(DefinedInTheNotebook(), batch_size=8, num_workers=2, multiprocessing_context="spawn")
    report = loaderdoctor.check(loader, budget_s=60)
    print(json.dumps({"exit_status": report.exit_status, "report": report.to_dict()}))
    """
)


def test_a_spawned_worker_that_cannot_import_a_class_of_an_interactive_session_is_a_critical_crash(tmp_path):
    # `python -c` has a __main__ without a file, as a notebook's kernel has: spawned workers cannot import it.
    # The crash ends the check at once; the budget is for a busy machine, where two spawned workers importing torch
    # beside two other checks and two CPU hogs had not died within 15 s (batch 0 was said to outlast the budget).
    result = subprocess.run(
        [sys.executable, "-c", NOTEBOOK], capture_output=True, text=True, timeout=100, env=_env(), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout.strip().splitlines()[-1])
    finding = _main_finding(output["report"])
    assert output["exit_status"] == 1, finding
    assert finding["rule"] == "worker-crash"
    assert finding["severity"] == "critical"
    assert "spawn" in finding["title"]
    assert "DefinedInTheNotebook" in finding["fix"] and "interactive session" in finding["fix"]


SEGFAULTING_SCRIPT = """\
import ctypes

import torch
from torch.utils.data import DataLoader, Dataset


class SegfaultsAt37(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        if index == 37:
            ctypes.string_at(0)
        return torch.full((16,), float(index))


if __name__ == "__main__":
    for batch in DataLoader(SegfaultsAt37(), batch_size=8, num_workers=2):
        pass
"""


def test_run_names_the_crash_of_a_script_whose_worker_segfaults(tmp_path):
    (tmp_path / "train.py").write_text(SEGFAULTING_SCRIPT)
    command = [sys.executable, "-m", "loaderdoctor", "run", "--json", "out.json", "train.py"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100, env=_env(), cwd=tmp_path)
    assert result.returncode == 1, result.stderr  # the script's own failure: torch's RuntimeError
    assert "worker-crash" in result.stderr, result.stderr[-6000:]
    (loader,) = json.loads((tmp_path / "out.json").read_text())["loaders"].values()
    finding = loader["findings"][0]
    assert finding["rule"] == "worker-crash" and finding["severity"] == "critical"
    assert finding["evidence"]["signal"] == "SIGSEGV"
