"""A training script run as `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would run it, in this process, with
every DataLoader it makes watched: its __main__, its argv, its sys.path[0], its output and its exit status are
the script's own; an exception is printed as Python prints it, from the script's first frame."""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from loaderdoctor.errors import UsageError
from loaderdoctor.job.loaders import EveryLoader, LoaderRun
from loaderdoctor.plain.usercode import is_own_file
from loaderdoctor.tap.signals import PRESS_BURST_S, SignalRaises, child_deaths_quiet, stopped_with_job

# The exit status of a script ended by Ctrl-C, as a shell reports a process that SIGINT ended.
INTERRUPTED_STATUS = 128 + signal.SIGINT


@dataclass(frozen=True)
class Script:
    """What to run: a file (`program` its path) or, with `module`, a module's name; and its arguments."""

    program: str
    args: tuple[str, ...] = ()
    module: bool = False
    named: str | None = None  # the command as the user named it, for a launcher found on PATH ("torchrun")

    def check(self) -> None:
        """A clear UsageError when the script cannot be found (before anything runs)."""
        if self.module:
            if not self.program:
                raise UsageError("-m needs a module's name", hint="loaderdoctor run -m package.train [ARGS...]")
            return
        path = Path(self.program)
        if not path.exists():
            raise UsageError(f"no such script: {self.program}", hint="give the training script's path "
                             "(loaderdoctor run train.py [ARGS...]), or a launcher written in Python that is on "
                             "PATH (loaderdoctor run torchrun --nproc-per-node 2 train.py)")  # fmt: skip
        if path.is_dir() and not (path / "__main__.py").exists():
            raise UsageError(f"{self.program} is a folder without __main__.py", hint="give the script's file")

    def found(self) -> Script:
        """The script to run: a launcher named as a command on PATH (torchrun, accelerate, deepspeed: a Python
        console script), where no file of that name is here, is run as the file PATH finds, as `python
        "$(which torchrun)" ...` runs it; a command on PATH that is not Python is a UsageError saying how such a
        launcher and `run` go together."""
        if self.module or os.sep in self.program or Path(self.program).exists():
            return self
        command = shutil.which(self.program)
        if command is None:
            return self  # check() says that there is no such script
        if not _is_python_script(Path(command)):
            raise UsageError(
                f"{self.program} ({command}) is a program, not a Python script: loaderdoctor run runs "
                "the Python of a job, in its own process",
                hint=f"start loaderdoctor run under it instead: {self.program} ... loaderdoctor run train.py "
                "[ARGS...] (srun, mpirun), each of its processes then watches its own loaders",
            )
        return Script(command, self.args, named=self.program)

    def words(self) -> str:
        """As typed after `python`: "train.py --epochs 3" or "-m pkg.train"."""
        return " ".join((["-m"] if self.module else []) + [self.named or self.program, *self.args])

    def argv(self) -> list[str]:
        """The arguments for `python` to run it."""
        return (["-m"] if self.module else []) + [self.program, *self.args]


@dataclass
class ScriptRun:
    """How the script ended, and what was watched while it ran."""

    exit_status: int
    loaders: list[LoaderRun] = field(default_factory=list)
    ended_by: str | None = None  # "an exception", "Ctrl-C", "SIGTERM", or None when it ran to its end or exit()
    diagnosed_on: str | None = None  # where the job's diagnosis is, when not here (node 0, rank 0)


def presses_of_ctrl_c() -> SignalRaises:
    """Ctrl-C as Python has it (KeyboardInterrupt in the main thread), for the time a script and its summary run:
    never lost (where Python would swallow it: a __del__, a fork hook), and pressed three times fast it is one
    press, so that the script's clean-up and the summary after it are not cut short by the rest of the burst (see
    SignalRaises; a press after a pause raises again). Install it from the main thread, uninstall it after."""
    return SignalRaises(signal.SIGINT, _interrupted, burst_s=PRESS_BURST_S)


def _interrupted(signum: int) -> BaseException:
    return KeyboardInterrupt()


# A console script's first bytes (its #! line, or pip's /bin/sh line and the exec line after it for a long path).
_SHEBANG_BYTES = 512


def _is_python_script(path: Path) -> bool:
    """Whether the file a command names is a Python script: its #! line (or, for a console script that pip wrote
    for a long interpreter path, the exec line after `#!/bin/sh`) runs a python."""
    try:
        with path.open("rb") as file:
            start = file.read(_SHEBANG_BYTES)
    except OSError:
        return False
    if not start.startswith(b"#!"):
        return False
    first, *rest = start.split(b"\n")[:3]
    interpreter = first[2:].split()  # b"#!/usr/bin/env python3" -> [b"/usr/bin/env", b"python3"]
    if any(b"python" in os.path.basename(word) for word in interpreter):
        return True
    return interpreter == [b"/bin/sh"] and any(b"exec" in line and b"python" in line for line in rest)


def run_script(script: Script, every: EveryLoader, presses: SignalRaises | None = None) -> ScriptRun:
    """Run `script` here with `every`'s hooks installed (and SIGTERM made an exit, so that a killed script still
    leaves its summary); then end every watch (which uninstalls the hooks). sys.argv, sys.path[0] and __main__
    are restored. `presses` (presses_of_ctrl_c(), installed by the caller) tells a script that Ctrl-C ended."""
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    term = SignalRaises(signal.SIGTERM, _Terminated)  # unless the program had a handler of its own for it
    term.install()
    every.install()
    error: BaseException | None = None
    status = 0
    try:
        status = _run(script)
    except BaseException as raised:  # told below, once torch's SIGCHLD handler cannot cut the telling short
        error = raised
    # torch's handler tells a dead worker's death again at each child's exit while its iterator lives (its other
    # workers ending, as the watches close them), wherever the main thread is: it would end the summary that
    # reports that very death. Quiet from here until every watch is closed (their workers ended).
    with child_deaths_quiet():
        try:
            if presses is not None:
                presses.settle()  # a Ctrl-C held back is not raised again in the summary
            if term.received is not None:
                # The script was ended by SIGTERM: by its exception, or by what the signal broke first (the workers
                # it ended too, whose lost batch torch raises in next()), or its exception was swallowed and the
                # script ended before it came again. As a plain `python` ends on SIGTERM: no traceback.
                status, ended_by = 128 + term.received, "SIGTERM"
            elif error is not None and presses is not None and presses.received and stopped_with_job(signal.SIGINT):
                # Ctrl-C ended it: its KeyboardInterrupt, or what it broke first (the workers it stopped too)
                if isinstance(error, KeyboardInterrupt):
                    _print_exception(type(error), error, error.__traceback__)
                status, ended_by = INTERRUPTED_STATUS, "Ctrl-C"
            elif error is not None:
                status, ended_by = _ending(error)
            else:
                ended_by = None
        finally:
            term.uninstall()
            sys.argv[:] = saved_argv
            if saved_path0 is not None:
                sys.path[0] = saved_path0
        return ScriptRun(status, every.close(), ended_by)


def _ending(error: BaseException) -> tuple[int, str]:
    """The exit status and the words for a script that `error` ended (printed as Python prints it, but for
    SIGTERM's own exception)."""
    if isinstance(error, _Terminated):
        return 128 + error.signum, "SIGTERM"
    _print_exception(type(error), error, error.__traceback__)
    if isinstance(error, KeyboardInterrupt):
        return INTERRUPTED_STATUS, "Ctrl-C"
    return 1, "an exception"


def _run(script: Script) -> int:
    """The script's exit status when it returns or calls exit(); exceptions pass."""
    sys.argv[:] = [script.program, *script.args]  # run_module puts the module's file in argv[0]
    try:
        if script.module:
            sys.path[0] = os.getcwd()
            runpy.run_module(script.program, run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(script.program)  # as python names the script in __file__ and tracebacks
            sys.path[0] = os.path.dirname(os.path.realpath(path))
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    return 0


def _exit_status(code: Any) -> int:
    """The status Python exits with for SystemExit(code): None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


class _Terminated(BaseException):
    """SIGTERM ends the script as an exception (its finally blocks run), then the summary is written."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"ended by signal {signum}")
        self.signum = signum


def _print_exception(kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
    """As Python prints an uncaught exception: from the script's first frame (runpy's and ours left out)."""
    if error is None:
        return
    while tb is not None and _not_the_scripts(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(kind, error, tb, file=sys.stderr)


def _not_the_scripts(filename: str) -> bool:
    """A frame of loaderdoctor's or of runpy's (frozen into Python 3.11: "<frozen runpy>") above the script's."""
    return filename in ("<frozen runpy>", runpy.__file__) or is_own_file(filename)
