"""`loaderdoctor run torchrun ...`: a launcher named as a command is found on PATH and run as the Python script it
is (as `python "$(which torchrun)"` runs it), named as it was typed; a program that is not Python is refused
with how to combine the two; a file of that name here is the script itself."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from loaderdoctor.errors import UsageError
from loaderdoctor.job.script import Script


def _command(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def bin_folder(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.chdir(tmp_path)
    return folder


def test_a_python_console_script_on_path_is_run_as_its_file_and_named_as_typed(bin_folder):
    launcher = _command(bin_folder, "mylaunch", "#!/usr/bin/env python3\nimport sys\n")
    script = Script("mylaunch", ("--nproc-per-node", "2", "train.py")).found()
    assert script.program == str(launcher)
    assert script.argv() == [str(launcher), "--nproc-per-node", "2", "train.py"]
    assert script.words() == "mylaunch --nproc-per-node 2 train.py"
    script.check()


def test_a_console_script_pip_wrote_for_a_long_interpreter_path_is_python_too(bin_folder):
    text = "#!/bin/sh\n'''exec' \"/a/very/long/path/bin/python3.11\" \"$0\" \"$@\"\n' '''\nimport sys\n"
    launcher = _command(bin_folder, "accelerate", text)
    assert Script("accelerate", ("launch", "train.py")).found().program == str(launcher)


def test_a_program_that_is_not_python_is_refused_saying_to_start_run_under_it(bin_folder):
    _command(bin_folder, "srun", "#!/bin/sh\nexec true\n")
    _command(bin_folder, "binary", "\x7fELF\x02\x01\x01")
    for name in ("srun", "binary"):
        with pytest.raises(UsageError, match=f"{name} .* is a program, not a Python script") as caught:
            Script(name, ("train.py",)).found()
        assert f"{name} ... loaderdoctor run train.py" in caught.value.hint


def test_a_file_here_a_path_a_module_and_an_unknown_name_are_left_as_they_are(bin_folder, tmp_path):
    _command(bin_folder, "train.py", "#!/usr/bin/env python3\n")
    (tmp_path / "train.py").write_text("print('mine')\n")
    assert Script("train.py").found() == Script("train.py")  # the file here, not the command on PATH
    assert Script("./bin/train.py").found().program == "./bin/train.py"
    assert Script("torch.distributed.run", module=True).found() == Script("torch.distributed.run", module=True)
    unknown = Script("nowhere").found()
    assert unknown == Script("nowhere")
    with pytest.raises(UsageError, match="no such script: nowhere") as caught:
        unknown.check()
    assert "on PATH" in caught.value.hint and os.sep not in unknown.program
