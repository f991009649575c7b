"""The command line: parse the arguments, hand them to the subcommand, show its errors. main(argv) returns the
exit status; the subcommands live in loaderdoctor.commands."""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import os
import re
import select
import sys
import warnings
from collections.abc import Callable
from typing import Any, TextIO

# Imported whole before Ctrl-C is let through (startup.release_interrupt): numpy loads numpy.random on first
# use, and a Ctrl-C in the middle of that import can leave it half-initialised for the code handling the Ctrl-C.
import numpy.random  # noqa: F401
from rich.markup import escape

from loaderdoctor import startup
from loaderdoctor.commands import COMMANDS
from loaderdoctor.errors import LoaderDoctorError, LoaderDoctorWarning, UsageError
from loaderdoctor.render.terminal import SafeConsole, VisibleFormatter


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as UsageError in the user's words: "--budget must be ..."."""

    def error(self, message: str) -> None:  # type: ignore[override]
        commands = ", ".join(COMMANDS)
        if choice := re.match(r"argument command: invalid choice: '(.*)' \(", message):
            message = f"unknown command '{choice[1]}': use one of {commands}"
        elif "required: command" in message:
            message = f"give a command: one of {commands}"
        else:  # "argument --budget: must be ..." (a value our types refused), "argument --x: expected ..."
            message = re.sub(r"^argument ([^:]+): must be", r"\1 must be", message)
            message = re.sub(r"^argument ([^:]+):", r"\1:", message)
        raise UsageError(message, hint=f"see `{self.prog} --help`")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loaderdoctor", description="Find out why a PyTorch training job waits on its data.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what loaderdoctor does")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in COMMANDS.values():
        command.prepare_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line with `argv` (sys.argv[1:] by default); return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    out = SafeConsole(highlight=False, file=None if sys.stdout.isatty() else _TrimmedLines(sys.stdout))
    err = SafeConsole(stderr=True, highlight=False, file=None if sys.stderr.isatty() else _TrimmedLines(sys.stderr))
    restore_logging = None
    try:
        if startup.release_interrupt():  # Ctrl-C while loaderdoctor was importing: nothing has run yet
            err.print("interrupted: stopped before anything ran")
            return 130
        args = _parse(argv)
        restore_logging = _log_to_stderr(args)
        return COMMANDS[args.command].run(args, out, err)
    except LoaderDoctorError as error:
        # soft_wrap: a path or a file:line in a message must not be broken by an inserted newline
        err.print(f"[bold red]error:[/] {escape(error.message)}", soft_wrap=True)
        if error.hint:
            err.print(f"[dim]hint:[/] {escape(error.hint)}", soft_wrap=True)
        schema = _json_schema(argv)
        if schema is not None:
            print(json.dumps({"schema": schema, "error": error.message, "hint": error.hint}, indent=2))
        return error.exit_status
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except OSError as error:
        if not _stdout_lost(error):
            raise
        err.print(f"[bold red]error:[/] cannot write to standard output: {escape(str(error))}", soft_wrap=True)
        err.print(
            "[dim]hint:[/] something closed it (the target or its dataset?) or its reader went away; check, tune and "
            "scale keep their runs in the history: `loaderdoctor report latest` shows the last one",
            soft_wrap=True,
        )
        return 1
    finally:
        if restore_logging is not None:
            restore_logging()


def _parse(argv: list[str]) -> argparse.Namespace:
    """The arguments; a command with split_argv() (run) parses only its own words, the rest are its script's."""
    at = next((i for i, word in enumerate(argv) if word in COMMANDS), None)
    split = getattr(COMMANDS[argv[at]], "split_argv", None) if at is not None else None
    if split is None:
        return _parser().parse_args(argv)
    own, script = split(argv[at + 1 :])
    args = _parser().parse_args(argv[: at + 1] + own)
    args.script_and_args = script
    return args


def _log_to_stderr(args: argparse.Namespace) -> Callable[[], None]:
    """loaderdoctor's log on stderr (INFO with -v), its control characters made visible; loaderdoctor's warnings
    (LoaderDoctorWarning) shown as lines of that log too (see _warnings_as_log_lines). `run` leaves the root logger
    to the script it runs (whose logging.basicConfig() must still work) and gives the loaderdoctor logger a
    handler of its own. The callable returned puts back what was changed."""
    level = logging.INFO if args.verbose else logging.WARNING
    handler = logging.StreamHandler()
    handler.setFormatter(VisibleFormatter("loaderdoctor: %(levelname)s: %(message)s"))
    restore_warnings = _warnings_as_log_lines()
    if args.command != "run":
        logging.basicConfig(level=level, handlers=[handler])
        return restore_warnings
    own = logging.getLogger("loaderdoctor")
    before = own.level, own.propagate
    own.addHandler(handler)
    own.setLevel(level)
    own.propagate = False

    def restore() -> None:
        restore_warnings()
        own.removeHandler(handler)
        own.setLevel(before[0])
        own.propagate = before[1]

    return restore


def _warnings_as_log_lines() -> Callable[[], None]:
    """Show each LoaderDoctorWarning as one line of loaderdoctor's log ("loaderdoctor: WARNING: ...") instead of
    Python's warning format with its source file and line; other warnings (a script's own, under `run`) go on
    to the showwarning in place before. Warning filters apply first, as always. Returns what puts it back."""
    previous = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *where: Any, **more: Any) -> None:
        if not issubclass(category, LoaderDoctorWarning):
            previous(message, category, *where, **more)
            return
        logging.getLogger("loaderdoctor").warning("%s", re.sub(r"\s*\n\s*", " ", str(message)))

    warnings.showwarning = show

    def restore() -> None:
        if warnings.showwarning is show:
            warnings.showwarning = previous

    return restore


def _stdout_lost(error: OSError) -> bool:
    """Whether `error` is standard output gone: closed (EBADF: the target closed fd 1, which a file it opened
    since may hold, read-only), or its reader gone (EPIPE). Then fd 1 is pointed at /dev/null, so that Python's
    own flush at exit fails no more."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # captured output (a test), or no stdout at all
        return False
    if error.errno == errno.EBADF:
        try:
            lost = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        except OSError:
            lost = True  # closed
    elif error.errno == errno.EPIPE:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        lost = any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    else:
        lost = False
    if not lost:
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return True


class _TrimmedLines:
    """A text stream that drops the spaces rich pads its lines with, for output piped to a file or a CI log."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.pending = ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.stream.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.write(self.pending)
        self.pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def _json_schema(argv: list[str]) -> str | None:
    """The schema of the JSON a command line asked for with --json (read from the words, since the error may
    have come before they were parsed), or None."""
    if "--json" not in argv or "run" in argv:
        return None
    command = next((COMMANDS[word] for word in argv if word in COMMANDS), None)
    if command is None or command.SCHEMA is None:
        return "loaderdoctor.error/1"
    return command.SCHEMA


if __name__ == "__main__":
    sys.exit(main())
