"""`loaderdoctor run [OPTIONS] SCRIPT [ARGS...]` (or `-m MODULE [ARGS...]`): an unmodified training script run as
Python (or, with --nproc-per-node, torchrun) would run it, every DataLoader it makes watched on its real steps;
at its end a summary on stderr (the script's own output untouched), the runs kept in the history, --json and
--html files; the exit status is the script's."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console

from loaderdoctor.commands.arguments import add_history_arg, count
from loaderdoctor.commands.running import log_to_trackers
from loaderdoctor.commands.showing import html_file, render_console
from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.history.keep import keep_loader_run
from loaderdoctor.job.joining import JobRun, disarm_inherited, run_job
from loaderdoctor.job.loaders import EveryLoader
from loaderdoctor.job.meeting import DEFAULT_TIMEOUT_S, MeetingStopped
from loaderdoctor.job.ranks import CEILING_ENV, RanksRun, ceiling_env, run_ranks
from loaderdoctor.job.script import Script, ScriptRun, presses_of_ctrl_c
from loaderdoctor.render import html
from loaderdoctor.render import json as json_render
from loaderdoctor.render.kinds import report_page
from loaderdoctor.report import Report, UnwatchedProcess
from loaderdoctor.saved import as_saved
from loaderdoctor.scale.launch import check_rank_count
from loaderdoctor.scale.order import Topology
from loaderdoctor.tap.ceiling import DEFAULT_STEPS
from loaderdoctor.tap.signals import child_deaths_quiet

NAME = "run"
SCHEMA = None  # --json names a file: stdout is the script's


def prepare_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        NAME,
        help="run a training script unchanged, every DataLoader watched; a diagnosis at its end",
        usage="loaderdoctor run [OPTIONS] SCRIPT [ARGS...]   or   loaderdoctor run [OPTIONS] -m MODULE [ARGS...]",
        description="Runs SCRIPT as `python SCRIPT ARGS` would (with --nproc-per-node N, as torchrun would), every "
        "DataLoader it makes watched on the script's real steps. At the end: a diagnosis per loader (and per "
        "rank) on stderr, the runs kept in the history, --json/--html files. The script's output and exit "
        "status are its own.",
    )
    parser.add_argument("--nproc-per-node", type=count("ranks", minimum=1), default=1, metavar="N",
                        help="ranks on this node, started by torch.distributed's elastic launcher (default 1: the "
                        "script runs in this process)")  # fmt: skip
    parser.add_argument("--name", default=None, metavar="NAME",
                        help="put before each loader's name (train.py:41): runs are compared by name")  # fmt: skip
    parser.add_argument("--guard", action="store_true",
                        help="also guard every loader (never waits forever, never loses a sample)")  # fmt: skip
    parser.add_argument("--ceiling", type=_ceiling_steps, nargs="?", const=True, default=False, metavar="STEPS",
                        help="measure the job's ceiling: after the first epoch's start-up, for STEPS steps in turns "
                        f"(default {DEFAULT_STEPS}) each loader hands the loop the batch it got last, then goes on "
                        "where it stopped; those steps train on repeated batches (a diagnostic run)")  # fmt: skip
    parser.add_argument("--ceiling-only", action="store_true",
                        help="with --ceiling: end the script (exit status 0, its clean-up run) once the turns are "
                        "done")  # fmt: skip
    parser.add_argument("--json", type=html_file, default=None, metavar="FILE",
                        help="also write the diagnosis as JSON (schema loaderdoctor.check/1) to FILE")  # fmt: skip
    parser.add_argument("--html", type=html_file, default=None, metavar="FILE",
                        help="also write the diagnosis as one self-contained HTML page")  # fmt: skip
    add_history_arg(parser)
    nodes = parser.add_argument_group("across machines (run the same command on every node)")
    nodes.add_argument("--nnodes", type=count("nodes", minimum=1), default=1, metavar="N", help="nodes in the job")
    nodes.add_argument("--node-rank", type=count("as a node rank", minimum=0), default=0, metavar="K",
                       help="this node's rank, 0..N-1")  # fmt: skip
    nodes.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="node 0's address")
    nodes.add_argument("--rdzv-timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                       help="how long the nodes wait for each other before the job gives up (default "
                       f"{DEFAULT_TIMEOUT_S:g})")  # fmt: skip
    parser.add_argument("-m", dest="module", default=None, metavar="MODULE", help="run a module, as python -m does")
    parser.add_argument("script_and_args", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS...]")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """run's own words, and the script's (from SCRIPT, or from -m MODULE, on): what follows the script is its
    own, even when it looks like one of run's options."""
    takes_value = _own_options()
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "-m":
            return argv[: index + 2], argv[index + 2 :]
        option = word.split("=", 1)[0] if word.startswith("--") else word
        if option not in takes_value:
            return argv[:index], argv[index:]
        takes = takes_value[option]
        if takes == "maybe":  # an optional value (--ceiling [STEPS]): the next word when it is one (a number)
            takes = index + 1 < len(argv) and argv[index + 1].isdigit()
        index += 2 if takes and "=" not in word else 1
    return argv, []


@functools.cache
def _own_options() -> dict[str, bool | str]:
    """run's option strings (from its parser), each with whether it takes a value ("maybe" for an optional one)."""
    subparsers = argparse.ArgumentParser().add_subparsers()
    prepare_parser(subparsers)
    parser = subparsers.choices[NAME]
    return {
        option: "maybe" if action.nargs == "?" else action.nargs != 0
        for action in parser._actions
        for option in action.option_strings
    }


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    check_rank_count(args.nproc_per_node, "--nproc-per-node")
    script = _script(args)
    topology = Topology(args.nproc_per_node, args.nnodes, args.node_rank, args.rdzv_endpoint)
    disarm_inherited()  # started by a job's process: this run watches its own script
    if args.ceiling_only and args.ceiling is False:
        args.ceiling = True  # --ceiling-only says --ceiling too
    with presses_of_ctrl_c() as presses:  # a burst of Ctrl-C is one press, for the script and its summary alike
        with _environ(
            CEILING_ENV, ceiling_env(args.ceiling, args.ceiling_only)
        ):  # the job's processes and ranks inherit it
            if topology.world_size > 1:
                try:
                    result: ScriptRun = run_ranks(script, topology, guarded=args.guard, name=args.name,
                                                  rdzv_timeout_s=args.rdzv_timeout, say=_say(err))  # fmt: skip
                except MeetingStopped as stopped:
                    err.print(f"loaderdoctor run: stopped by {_STOPS.get(stopped.signum, str(stopped))} while "
                              "the nodes waited for each other; no rank started", markup=False)  # fmt: skip
                    return 128 + stopped.signum
            else:  # the processes the script starts (Lightning's ranks, mp.spawn's, torchrun's) watch their own
                every = EveryLoader(
                    guarded=args.guard, name=args.name, ceiling=args.ceiling, ceiling_only=args.ceiling_only
                )
                result = run_job(script, every, guarded=args.guard, name=args.name, presses=presses, say=_say(err))
        try:
            with child_deaths_quiet():  # torch's SIGCHLD handler would raise a dead worker's death again here
                _summarize(result, script, args, err)
        except Exception as error:  # loaderdoctor's failure never changes the script's outcome
            warnings.warn(f"loaderdoctor run could not summarize the run: {type(error).__name__}: {error}",
                          LoaderDoctorWarning, stacklevel=1)  # fmt: skip
    return result.exit_status


_STOPS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}


def _say(err: Console) -> Callable[[str], None]:
    """A line of `run` on stderr, as it happens."""
    return lambda text: err.print(f"loaderdoctor run: {text}", markup=False, highlight=False)


def _silent_why(how: str | None) -> str:
    """Why a rank is in the report without its loaders."""
    if how is None:
        return "it sent nothing of what it measured: ended before sending it, or never started"
    return f"it sent nothing of what it measured: it {how}"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"takes a number of seconds above 0, not {text!r}")
    return value


def _ceiling_steps(text: str) -> int:
    if not text.isdigit() or int(text) < 3:
        raise argparse.ArgumentTypeError(f"--ceiling takes a number of steps, 3 or more, not {text!r}")
    return int(text)


@contextlib.contextmanager
def _environ(variable: str, value: str) -> Iterator[None]:
    """`variable` set to `value` for the block (unset when empty), what was there put back after."""
    before = os.environ.get(variable)
    if value:
        os.environ[variable] = value
    else:
        os.environ.pop(variable, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before


def _script(args: argparse.Namespace) -> Script:
    if args.module is not None:
        script = Script(args.module, tuple(args.script_and_args), module=True)
    elif args.script_and_args:
        script = Script(args.script_and_args[0], tuple(args.script_and_args[1:]))
    else:
        raise UsageError("give the training script to run", hint="loaderdoctor run train.py [ARGS...]")
    script = script.found()
    script.check()
    return script


def _summarize(result: ScriptRun, script: Script, args: argparse.Namespace, err: Console) -> None:
    """The summary on stderr, the runs kept in the history, the --json and --html files, the --log-to trackers."""
    if result.diagnosed_on is not None:
        ranks_here = isinstance(result, RanksRun) or (isinstance(result, JobRun) and result.ranks_here)
        here = "this node's ranks" if ranks_here else "this rank"
        err.print()
        err.print(f"loaderdoctor run: the job's diagnosis (every rank) is printed on {result.diagnosed_on}; {here} "
                  f"ended with exit status {result.exit_status}" + (f", by {result.ended_by}" if result.ended_by
                  else ""), markup=False)  # fmt: skip
        if args.json is not None or args.html is not None:
            err.print(f"loaderdoctor run: --json and --html are written on {result.diagnosed_on}", markup=False)
        return
    if not args.no_history:
        for loader in result.loaders:
            keep_loader_run(NAME, loader.report, loader.started_at, loader.host, script.words())
    unwatched = list(result.unwatched) if isinstance(result, JobRun) else []
    if isinstance(result, RanksRun):
        unwatched += [UnwatchedProcess(None, rank, _silent_why(result.rank_ends.get(rank)))
                      for rank in result.silent_ranks]  # fmt: skip
    loaders = {run.report.name: run.report for run in result.loaders}
    report = as_saved(Report(script.words(), loaders, NAME, unwatched))
    err.print()
    if not report.loaders:
        err.print(f"loaderdoctor run: no DataLoader delivered a batch in {script.words()}", markup=False)
    else:
        render_console(report, err)
    for process in report.unwatched:
        err.print(f"loaderdoctor run: {process.words()}", markup=False)
    for note in result.notes if isinstance(result, JobRun) else []:
        err.print(f"loaderdoctor run: {note}", markup=False)
    if isinstance(result, RanksRun):
        for rank, seconds in sorted(result.so_far.items()):
            how = result.rank_ends.get(rank)
            err.print(f"loaderdoctor run: rank {rank} sent nothing at its end" + (f" (it {how})" if how else "")
                      + f": its diagnosis covers its first {seconds:.1f} s, as it sent them when an epoch ended",
                      markup=False)  # fmt: skip
        for node_end in result.node_ends:
            err.print(f"loaderdoctor run: {node_end.words()}", markup=False)
        for problem in result.problems:
            err.print(f"loaderdoctor run: {problem}", markup=False)
    if result.ended_by is not None:
        err.print(f"loaderdoctor run: the script was ended by {result.ended_by}; the diagnosis covers what it "
                  f"measured until then (exit status {result.exit_status})", markup=False)  # fmt: skip
    if args.json is not None:
        Path(args.json).write_text(json_render.render(report) + "\n")
        err.print(f"JSON written to {args.json}", highlight=False, markup=False)
    if args.html is not None:
        html.write_page(report_page(report), args.html)
        err.print(f"HTML report written to {args.html}", highlight=False, markup=False)
    log_to_trackers(report, args.log_to, err)
