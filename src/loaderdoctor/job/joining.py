"""A `loaderdoctor run` job marked in the environment while its script runs, so that every Python process it
starts (Lightning's re-launched ranks, torchrun's, mp.spawn's) watches its own loaders (see hook.py), and what
those processes wrote joined with the script's own loaders as `--nproc-per-node` joins its ranks'.

The mark is a private folder of the tool's (host/tempfolders.py) holding a sitecustomize.py, first on PYTHONPATH,
and JOB_ENV naming the folder: both in force only while the script runs. The processes that registered with the
job (a rank, or a process that made a loader) but wrote nothing are named: they could not be watched."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import py_compile
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.host.tempfolders import make_private_folder, remove_folder
from loaderdoctor.job import hook as jobhook
from loaderdoctor.job.endmeeting import meet_at_end
from loaderdoctor.job.hook import JOB_ENV, PROCESS_FILE, RESULT_FILE, SO_FAR_RESULT_FILE
from loaderdoctor.job.loaders import EveryLoader, LoaderRun
from loaderdoctor.job.places import this_place
from loaderdoctor.job.process import process_rank
from loaderdoctor.job.ranks import GUARD_ENV, NAME_ENV, SHUTDOWN_TIMEOUT_S, joined, read_runs
from loaderdoctor.job.script import Script, ScriptRun, run_script
from loaderdoctor.report import UnwatchedProcess
from loaderdoctor.tap.signals import SignalRaises
from loaderdoctor.watch.rankceilings import JobStore

# How long, once the script has ended, the job's processes that still run get to end and write what they measured
# (Lightning's rank 1 ends a moment after rank 0, the script, does).
GRACE_S = SHUTDOWN_TIMEOUT_S
# When the script was ended by a signal: its processes got Ctrl-C too, or will not end by themselves.
SIGNALLED_GRACE_S = 5.0
TELL_WAIT_AFTER_S = 2.0
# The name the job folder's sitecustomize gives the hook it loads (one per process).
HOOK_MODULE = "_loaderdoctor_jobhook"
SITECUSTOMIZE = '''"""loaderdoctor run's startup hook for the Python processes of one job: see {hook}."""


def _loaderdoctor_job():
    import importlib.machinery
    import os
    import sys

    try:
        hook = type(sys)("{module}")
        hook.__file__ = {hook!r}
        hook.__loader__ = importlib.machinery.SourceFileLoader("{module}", {hook!r})
        sys.modules["{module}"] = hook
        hook.__loader__.exec_module(hook)
    except Exception as error:
        print(f"loaderdoctor: the job's startup hook did not load ({{type(error).__name__}}: {{error}})",
              file=sys.stderr)
        return
    hook.run_at_startup(os.path.dirname(os.path.abspath(__file__)))


_loaderdoctor_job()
del _loaderdoctor_job
'''


@dataclass
class JobRun(ScriptRun):
    """A script's run with the loaders of every process of its job, and the processes that could not be watched."""

    unwatched: list[UnwatchedProcess] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the processes whose loaders are what they kept as epochs ended
    ranks_here: bool = False  # the ranks this run watched sent what they measured to rank 0's (`diagnosed_on`)


def run_job(
    script: Script,
    every: EveryLoader,
    *,
    guarded: bool,
    name: str | None,
    grace_s: float = GRACE_S,
    presses: SignalRaises | None = None,
    say: Callable[[str], None] = lambda text: None,
) -> JobRun:
    """Run `script` here (as run_script does, `presses` told) with its job marked: its own loaders, and those of
    every process it started that wrote, joined; the processes that could not be watched named. `say` tells of a
    wait for the job's other ranks, when the script is one."""
    try:
        folder = Path(make_private_folder("loaderdoctor-job-"))
    except OSError as error:
        warnings.warn(f"loaderdoctor run: the processes the script starts are not watched (no job folder: {error})",
                      LoaderDoctorWarning, stacklevel=2)  # fmt: skip
        run = run_script(script, every, presses)
        return JobRun(run.exit_status, run.loaders, run.ended_by)
    try:
        _write_hook(folder)
        every.joined_by = str(folder)  # its rank, when the script is one, is joined here (job/places.py)
        with _marked(folder, guarded=guarded, name=name):
            run = run_script(script, every, presses)
        return _joined(run, folder, process_rank(), grace_s, every.job, say)
    finally:
        remove_folder(folder)


def disarm_inherited() -> None:
    """A `loaderdoctor run` started by a job's process watches its own script: the job's hook in this process
    watches nothing."""
    hook = sys.modules.get(HOOK_MODULE)
    if hook is not None:
        with contextlib.suppress(Exception):
            hook.disarm()


def _write_hook(folder: Path) -> None:
    """The job's sitecustomize.py, compiled now: no process of the job writes its bytecode into the folder."""
    source = folder / "sitecustomize.py"
    source.write_text(SITECUSTOMIZE.format(hook=str(Path(jobhook.__file__).resolve()), module=HOOK_MODULE))
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)), doraise=True)


@contextlib.contextmanager
def _marked(folder: Path, *, guarded: bool, name: str | None) -> Iterator[None]:
    """The job's variables in os.environ for the block's time (the processes started meanwhile inherit them),
    what was there before put back after."""
    before = os.environ.get("PYTHONPATH")
    environ = {JOB_ENV: str(folder), "PYTHONPATH": os.pathsep.join([str(folder), *filter(None, [before])]),
               GUARD_ENV: "1" if guarded else "", NAME_ENV: name or ""}  # fmt: skip
    saved = {variable: os.environ.get(variable) for variable in environ}
    os.environ.update(environ)
    try:
        yield
    finally:
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value


def _joined(
    run: ScriptRun,
    folder: Path,
    rank: int | None,
    grace_s: float,
    job: JobStore | None = None,
    say: Callable[[str], None] = lambda text: None,
) -> JobRun:
    """The script's run with what its job's processes wrote, once those still running have ended (or `grace_s`
    has passed); as it was when none registered. When the script is one rank of a distributed `job`, the ranks
    meet at the end (endmeeting.py): rank 0's run has them all, the others' none (said to be on rank 0's node);
    so do the job's processes when they are ranks of a job that other runs watch too (a run on every node)."""
    if run.ended_by in ("Ctrl-C", "SIGTERM"):  # its processes got it too (Ctrl-C), or will not end by themselves
        grace_s = min(grace_s, SIGNALLED_GRACE_S)
    _wait_for(folder, grace_s)
    registered = jobhook.registered(folder)
    written: list[tuple[dict[str, Any], list[LoaderRun]]] = []
    for path in sorted(folder.glob(RESULT_FILE.format(pid="*"))):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            written.append(read_runs(path))
    wrote = {int(fields["pid"]) for fields, _ in written}
    running = _running(folder)
    notes: list[tuple[tuple[bool, int], int, str]] = []
    for path in sorted(folder.glob(SO_FAR_RESULT_FILE.format(pid="*"))):  # those that wrote nothing at their end
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            fields, runs = read_runs(path)
            pid = int(fields["pid"])
            if pid in wrote or pid in running or not runs:
                continue
            written.append((fields, runs))
            wrote.add(pid)
            notes.append((_rank_order(fields), pid, _ended_unwritten(fields, runs)))
    said = [note for *_, note in sorted(notes)]  # by rank
    unwatched = [
        UnwatchedProcess(
            pid, fields.get("rank"), fields.get("error") or _why(pid in running, grace_s), fields.get("argv", "")
        )
        for pid, fields in sorted(registered.items(), key=lambda item: (_rank_order(item[1]), item[0]))
        if pid not in wrote
    ]
    ranked = job is not None and job.world > 1  # the script is one rank of a job: the ranks meet at the end
    if not any(runs for _, runs in written) and not ranked:
        return JobRun(run.exit_status, run.loaders, run.ended_by, unwatched=unwatched, notes=said)
    if ranked:
        assert job is not None
        rank = job.rank  # as it was while the process group lived (the script may have destroyed it)
    loaders: dict[int, list[LoaderRun]] = {}
    hosts: dict[int, str] = {}
    if run.loaders:  # the script's own: a rank's when it is one (Lightning's rank 0), named so
        key = os.getpid() if rank is None else rank
        for loader in run.loaders:
            loader.report.name += "" if rank is None else f"/rank{rank}"
        loaders[key], hosts[key] = run.loaders, socket.gethostname()
    unranked = 0
    for fields, runs in sorted(written, key=lambda item: (_rank_order(item[0]), item[0]["pid"])):
        pid, their_rank = int(fields["pid"]), fields.get("rank")
        if not runs:
            continue
        key = their_rank
        if their_rank is None or their_rank in loaders:  # told apart by its place in the order the processes started
            key = pid
            unranked += 1  # "proc1", "proc2": the same names in the next run of the same job (a pid is not)
            for loader in runs:
                loader.report.name = loader.report.name.removesuffix(f"/rank{their_rank}") + f"/proc{unranked}"
        loaders[key], hosts[key] = runs, str(fields.get("host", ""))
    sizes = [int(fields.get("world_size") or 0) for fields, _ in written]
    for fields, _ in written:  # rank 0 of a job that other runs watch too: the ranks it gathered at its end
        said += [str(note) for note in fields.get("meeting_notes", [])]
        for their_rank, sent in (fields.get("gathered") or {}).items():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                loaders.setdefault(int(their_rank), [LoaderRun.from_dict(item) for item in sent["loaders"]])
                hosts.setdefault(int(their_rank), str(sent.get("host", "")))
    sent_to = {str(fields["sent_to"]) for fields, runs in written if runs and "sent_to" in fields}
    if sent_to and not any("gathered" in fields for fields, _ in written) and not ranked:
        return JobRun(run.exit_status, [], run.ended_by, _rank_0(sent_to), unwatched=unwatched, notes=said,
                      ranks_here=True)  # fmt: skip
    if ranked:
        assert job is not None and rank is not None
        have = {
            key for key, runs in loaders.items() if runs and any(r.report.name.endswith(f"/rank{key}") for r in runs)
        }
        met = meet_at_end(job, loaders.get(rank, []), have, here=this_place(str(folder)), say=say)
        if met.sent:
            return JobRun(run.exit_status, [], run.ended_by, _rank_0({met.rank0_host}), unwatched=unwatched,
                          notes=said + met.notes())  # fmt: skip
        said += met.notes()
        loaders.update(met.loaders)
        hosts.update(met.hosts)
        sizes.append(job.world)
    runs = joined(loaders, hosts, max([*sizes, len(loaders)]))
    return JobRun(run.exit_status, runs, run.ended_by, unwatched=unwatched, notes=said)


def _rank_0(hosts: set[str]) -> str:
    """Where the job's diagnosis is printed: rank 0's `run`, on its host when known."""
    host = next(iter(hosts)) if len(hosts) == 1 else ""
    return f"rank 0's node ({host})" if host else "rank 0's node"


def _ended_unwritten(fields: dict[str, Any], runs: list[LoaderRun]) -> str:
    """How a process that wrote nothing at its exit ended, and what its diagnosis covers (what it kept last)."""
    rank = "" if fields.get("rank") is None else f" (rank {fields['rank']})"
    seconds = max(run.report.recording.wall_s for run in runs)
    if fields.get("left_group"):  # Ray Train ends its workers so, once their training is over
        return (f"process {fields['pid']}{rank} ended without writing what it measured at its exit, after it left "
                f"its process group (as Ray ends its workers): its diagnosis covers all of its {seconds:.1f} s, up to "
                "its last epoch's end, kept as it left")  # fmt: skip
    return (f"process {fields['pid']}{rank} ended without writing what it measured (killed, os._exit, or a crash): "
            f"its diagnosis covers its first {seconds:.1f} s, as it kept them when an epoch ended")  # fmt: skip


def _wait_for(folder: Path, grace_s: float) -> None:
    """Until the job's processes that registered and have not written end, `grace_s` at most (said once it has
    been a while; a Ctrl-C ends the wait)."""
    deadline = time.monotonic() + grace_s
    told = False
    with contextlib.suppress(KeyboardInterrupt):
        while (running := _running(folder)) and time.monotonic() < deadline:
            if not told and deadline - time.monotonic() < grace_s - TELL_WAIT_AFTER_S:
                told = True
                pids = ", ".join(map(str, sorted(running)))
                print(f"loaderdoctor run: waiting up to {grace_s:g} s for the script's processes that still run to "
                      f"end (pid {pids})", file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(0.05)


def _rank_order(fields: dict[str, Any]) -> tuple[bool, int]:
    """Ranks first, in order; then the processes without one."""
    rank = fields.get("rank")
    return (rank is None, rank if isinstance(rank, int) else 0)


def _running(folder: Path) -> set[int]:
    """The registered processes that have not written and still run (not a zombie, nor a later process that
    took a pid that ended)."""
    running = set()
    for path in folder.glob(PROCESS_FILE.format(pid="*")):
        pid_text = path.name.removeprefix("process").removesuffix(".started")
        if not pid_text.isdigit() or (folder / RESULT_FILE.format(pid=pid_text)).exists():
            continue
        with contextlib.suppress(OSError, psutil.Error):
            process = psutil.Process(int(pid_text))
            if process.status() != psutil.STATUS_ZOMBIE and process.create_time() <= path.stat().st_mtime + 1:
                running.add(process.pid)
    return running


def _why(running: bool, grace_s: float) -> str:
    if running:
        return f"it still ran {grace_s:g} s after the script ended"
    return "it ended before writing what it measured (killed, os._exit, or a crash)"
