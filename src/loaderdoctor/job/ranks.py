"""A script run as N ranks on each of the job's nodes, as torchrun runs it: once the nodes met in the job's store
(job/meeting.py), torch.distributed's elastic launcher starts `python -m loaderdoctor.job SCRIPT ARGS`
(job/__main__.py, job/onerank.py) in each rank (the script's output goes where torchrun's would); each rank runs
the script with its loaders watched and sends what it measured to node 0 through that store; node 0 gathers every
rank of the job (job/gathering.py) and joins them here, the rules across ranks judged on each loader's ranks; the
other nodes say where that is. SIGTERM or Ctrl-C to the launching process ends every rank of its node as it ends one
`python train.py` (see RankEnds); a node lost (its heartbeat) ends them too."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from loaderdoctor.host.tempfolders import make_private_folder, remove_folder
from loaderdoctor.job.gathering import NodeEnd, gather, runs_from_text, runs_text, tell_end
from loaderdoctor.job.loaders import LoaderRun
from loaderdoctor.job.meeting import DEFAULT_TIMEOUT_S, STORE_ENV, Heartbeat, meet
from loaderdoctor.job.script import Script, ScriptRun
from loaderdoctor.loader.ddp import DdpPlan, ddp_plan
from loaderdoctor.recording.record import Recording
from loaderdoctor.rules import order
from loaderdoctor.rules.ceiling import job_ceiling
from loaderdoctor.rules.distributed import distributed_sampler, recorded_facts
from loaderdoctor.rules.straggler import rank_straggler
from loaderdoctor.scale.launch import free_port, signal_session
from loaderdoctor.scale.order import Topology, endpoint_parts, static_launch_config
from loaderdoctor.tap.signals import (
    PRESS_BURST_S,
    in_main_thread,
    note_stop,
)

# What the ranks read from their environment: where to write, and whether to guard.
RUN_DIR_ENV = "LOADERDOCTOR_RUN_DIR"
GUARD_ENV = "LOADERDOCTOR_RUN_GUARD"
NAME_ENV = "LOADERDOCTOR_RUN_NAME"
# What each rank runs, `python -m RANK_MODULE SCRIPT ARGS`: job/__main__.py, a module nothing imports, so that
# runpy finds it not yet imported (running job/ranks.py itself, which the package's imports load first, made every
# rank warn "found in sys.modules ... prior to execution").
RANK_MODULE = "loaderdoctor.job"
# run --ceiling [STEPS]: "" off, "default", or the data-free steps; read by the ranks and the job's processes alike
CEILING_ENV = "LOADERDOCTOR_RUN_CEILING"
# After a rank fails, or a signal came, how long the ranks get to end (and write what they measured) before SIGKILL.
SHUTDOWN_TIMEOUT_S = 30
# When another node is lost, how long this node's ranks get: they are mostly stuck in a collective with it, where
# no signal handler runs.
LOST_GRACE_S = 5.0
RENDEZVOUS_TIMEOUT_S = 900
# A rank's files in this node's run folder: what it measured, at its end when node 0's store cannot be reached, and
# so far, as its epochs end (read when node 0 is lost).
RANK_FILE = "rank{rank}.json"
SO_FAR_FILE = "so-far-rank{rank}.json"
# Where torch's launcher says which signals it turns into its SignalException.
TORCH_SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
_SAID = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}


@dataclass
class RanksRun(ScriptRun):
    """A run of ranks: how it ended, the loaders of every rank of the job (on node 0; none on the other nodes,
    which say where the job's diagnosis is: `diagnosed_on`), the ranks that sent nothing (they ended before they
    could, or never started), how the other nodes ended, and what could not be read."""

    silent_ranks: list[int] = field(default_factory=list)
    node_ends: list[NodeEnd] = field(default_factory=list)
    rank_ends: dict[int, str] = field(default_factory=dict)  # rank -> how it ended, when not by itself
    problems: list[str] = field(default_factory=list)
    so_far: dict[int, float] = field(default_factory=dict)  # rank -> seconds into its run of what it sent last


def run_ranks(
    script: Script,
    topology: Topology,
    *,
    guarded: bool,
    name: str | None = None,
    rdzv_timeout_s: float = DEFAULT_TIMEOUT_S,
    say: Callable[[str], None] = lambda text: None,
) -> RanksRun:
    """Run `script` in `topology.ranks` ranks on this node, once every node of the job met (job/meeting.py: said,
    stoppable, bounded; NodesDidNotMeet or MeetingStopped); its exit status (128 + the signal that ended it, else
    the rank that failed first's, else 0). On node 0 the loaders of every rank of the job, once every node ended
    (or was lost), with rank-straggler and the job's findings added; elsewhere none, and node 0's host. Every rank
    of this node has ended when it returns."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    if topology.rdzv_endpoint is None:
        host, port = "127.0.0.1", free_port()
    else:
        host, port = endpoint_parts(topology.rdzv_endpoint)
    meeting = meet(host, port, node_rank=topology.node_rank, nnodes=topology.nnodes, timeout_s=rdzv_timeout_s,
                   say=say)  # fmt: skip
    work = Path(make_private_folder("loaderdoctor-run-"))
    heartbeat: Heartbeat | None = None
    try:
        config = static_launch_config(
            topology,
            endpoint=meeting.endpoint,
            run_id="loaderdoctor-run",
            log_dir=str(work / "logs"),
            rendezvous_timeout_s=RENDEZVOUS_TIMEOUT_S,
            shutdown_timeout_s=SHUTDOWN_TIMEOUT_S,
            keep_output=False,  # the script's output goes where torchrun's would
        )
        config = dataclasses.replace(config, signals_to_handle="SIGHUP,SIGQUIT")  # SIGTERM and SIGINT: RankEnds
        environ = {RUN_DIR_ENV: str(work), GUARD_ENV: "1" if guarded else "", NAME_ENV: name or "",
                   STORE_ENV: meeting.endpoint}  # fmt: skip
        if topology.ranks > 1:
            environ.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # as torchrun sets it
        # The launcher sets TORCHELASTIC_SIGNALS_TO_HANDLE for the signals it handles: put back afterwards too.
        saved = {variable: os.environ.get(variable) for variable in [*environ, TORCH_SIGNALS_ENV]}
        os.environ.update(environ)
        # The launcher's loggers, each with a level of its own (torch sets one per module)
        launcher = ("torch.distributed.elastic", "torch.distributed.launcher")
        names = {*launcher, *(name for name in logging.root.manager.loggerDict if name.startswith(launcher))}
        quiet = [logging.getLogger(name) for name in sorted(names)]
        levels = [logger.level for logger in quiet]
        for logger in quiet:
            logger.setLevel(logging.ERROR)  # the launcher's own chatter; a rank's failure comes back as its status
        status, ended_by = 0, None
        rank_ends: dict[int, str] = {}
        ends = RankEnds(SHUTDOWN_TIMEOUT_S)
        heartbeat = Heartbeat(meeting, lambda node, seconds: ends.end_now(LOST_GRACE_S)).__enter__()
        try:
            with ends:
                elastic_launch(config, sys.executable)("-m", RANK_MODULE, *script.argv())
        except ChildFailedError as error:
            failed_rank, first = _first_failure(error.failures)
            status = first.exitcode if first.exitcode >= 0 else 128 - first.exitcode
            ended_by = f"rank {failed_rank} failing"
            rank_ends = {rank: _how(failure.exitcode) for rank, failure in error.failures.items()}
        except SignalException as error:  # SIGHUP or SIGQUIT, by torch's launcher; SIGTERM and SIGINT by RankEnds
            status, ended_by = 128 + int(error.sigval), signal.Signals(error.sigval).name
        except OSError as error:  # a rank could not be started (no fork: too many processes, no memory)
            status, ended_by = 1, f"a failure to start the ranks ({type(error).__name__}: {error})"
        finally:
            for logger, level in zip(quiet, levels, strict=True):
                logger.setLevel(level)
            for variable, value in saved.items():
                if value is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = value
        if ends.received is not None:  # whatever the ranks' statuses: the script was ended by the signal
            status, ended_by = 128 + ends.received, _SAID[ends.received]
        if heartbeat.lost_node is not None:
            lost = heartbeat.lost_node
            status, ended_by = 1, f"node {lost} ({meeting.host(lost)}) being lost: its heartbeat stopped"
        first = topology.node_rank * topology.ranks
        mine = range(first, first + topology.ranks)
        if topology.node_rank != 0:
            if heartbeat.lost_node is None:
                end = NodeEnd(topology.node_rank, socket.gethostname(), status, ended_by,
                              {str(rank): how for rank, how in rank_ends.items()})  # fmt: skip
                tell_end(meeting, end)
                return RanksRun(status, [], ended_by, f"node 0 ({meeting.host(0)})", rank_ends=rank_ends)
            loaders, hosts, so_far = _written(work)  # node 0 is gone: this node's own ranks, as they wrote them
            silent = [rank for rank in mine if rank not in loaders]
            return RanksRun(status, joined(loaders, hosts, topology.world_size), ended_by, silent_ranks=silent,
                            rank_ends=rank_ends, so_far=so_far)  # fmt: skip
        gathered = gather(meeting, heartbeat, topology.world_size, say=say)
        loaders, hosts = gathered.loaders, gathered.hosts
        written, written_hosts, written_so_far = _written(work)
        for rank, runs in written.items():  # a rank of this node that could not reach the store
            if rank not in loaders or (rank in gathered.so_far and rank not in written_so_far):
                loaders[rank], hosts[rank] = runs, written_hosts[rank]
                gathered.so_far.pop(rank, None)
                if rank in written_so_far:
                    gathered.so_far[rank] = written_so_far[rank]
        for node_end in gathered.node_ends:
            rank_ends.update({int(rank): how for rank, how in node_end.rank_ends.items() if rank.isdigit()})
            if node_end.lost_after_s is not None and ends.received is None:
                # what this node's ranks died of, when they failed: their collectives with the lost node broke
                status, ended_by = 1, f"node {node_end.node} ({node_end.host}) being lost"
            elif status == 0 and node_end.exit_status != 0:
                status, ended_by = node_end.exit_status, node_end.ended_by or f"node {node_end.node} failing"
        silent = [rank for rank in range(topology.world_size) if rank not in loaders]
        joined_runs = joined(loaders, hosts, topology.world_size)
        return RanksRun(status, joined_runs, ended_by, silent_ranks=silent, node_ends=gathered.node_ends,
                        rank_ends=rank_ends, problems=gathered.problems, so_far=gathered.so_far)  # fmt: skip
    finally:
        if heartbeat is not None:
            heartbeat.__exit__()
        remove_folder(work)


def _how(exitcode: int) -> str:
    """How a rank ended, in words, from its exit code as torch's launcher has it (-N: signal N)."""
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-exitcode).name}"
        return f"was killed by signal {-exitcode}"
    return f"ended with exit status {exitcode}"


class RankEnds:
    """SIGTERM and SIGINT to the launching process while its ranks run, and the ranks a launch leaves behind.
    torch's launcher would raise either as its SignalException and send it to each rank's whole session, its
    DataLoader workers with it: a rank whose workers die of SIGTERM can die of their deaths before it writes
    what it measured. Here, as a scheduler or a terminal signals one `python train.py`, the first signal goes
    to each rank's own process: each ends its script, closes its watches (which end its workers) and writes
    what it measured. The launcher waits for them (`grace_s` at most, then their sessions are killed), then its
    launch ends as torch's does (SignalException, which also ends the ranks started meanwhile). A second signal
    kills the ranks' sessions at once (unless it is the rest of a burst: a key pressed three times fast is one
    press). The ranks still running when the launch ends (those started before one
    that failed to start) are ended the same way. The ranks are the processes this one started meanwhile."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.received: int | None = None
        self._before: set[int] = set()
        self._previous: dict[int, Any] = {}
        self._launching = False
        self._exception: Any = None
        self._last_at = 0.0  # when the last signal came (time.monotonic())

    def __enter__(self) -> RankEnds:
        from torch.distributed.elastic.multiprocessing import SignalException

        self._exception = SignalException  # imported here, not in the handler
        self._before = {child.pid for child in psutil.Process().children()}
        if in_main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        self._launching = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._launching = False
        try:
            self._end(self.received or signal.SIGTERM)  # what the launch left running
        finally:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
            self._previous = {}
            for pid in self._ranks(exited=True):  # reaped: the launcher's own handles on them are gone
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def _handle(self, signum: int, frame: Any) -> None:
        note_stop(signum)
        now = time.monotonic()
        if self.received is not None:
            if now - self._last_at < PRESS_BURST_S:  # the same Ctrl-C, pressed three times fast: the ranks end
                self._last_at = now
                return
            for pid in self._ranks():  # again, after a pause: no more waiting
                signal_session(pid, signal.SIGKILL)
            return
        self.received, self._last_at = signum, now
        self._end(signum)
        if self._launching:
            raise self._exception(f"loaderdoctor run got {signal.Signals(signum).name}", signal.Signals(signum))

    def end_now(self, grace_s: float) -> None:
        """End this node's ranks from another thread (another node was lost): SIGTERM to each rank, the sessions
        of those still running `grace_s` later killed; the launch then ends with their failures."""
        self.grace_s = grace_s
        self._end(signal.SIGTERM)

    def _end(self, signum: int) -> None:
        """`signum` to each rank's own process; the sessions of those still running `grace_s` later killed."""
        ranks = self._ranks()
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + self.grace_s
        while ranks and time.monotonic() < deadline:
            time.sleep(0.05)
            ranks = self._ranks()
        for pid in ranks:
            signal_session(pid, signal.SIGKILL)

    def _ranks(self, *, exited: bool = False) -> list[int]:
        """The processes started since the launch began that still run (with `exited`, those ended unreaped)."""
        found = []
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if child.pid not in self._before and (child.status() == psutil.STATUS_ZOMBIE) == exited:
                    found.append(child.pid)
        return found


def _first_failure(failures: dict[int, Any]) -> tuple[int, Any]:
    """The rank that failed first, and its failure: the launcher ends the others with SIGTERM when one fails,
    and its timestamps are whole seconds, so a rank ended by SIGTERM comes after one that failed otherwise."""
    ended = (-signal.SIGTERM, 128 + signal.SIGTERM)
    return min(failures.items(), key=lambda item: (item[1].timestamp, item[1].exitcode in ended, item[0]))


def _written(work: Path) -> tuple[dict[int, list[LoaderRun]], dict[int, str], dict[int, float]]:
    """What each rank of this node wrote here (its loaders: at its end, else as its epochs ended), each rank's
    host, and the ranks whose loaders are what they wrote as their epochs ended, with how far into their run."""
    loaders: dict[int, list[LoaderRun]] = {}
    hosts: dict[int, str] = {}
    so_far: dict[int, float] = {}
    for pattern in (RANK_FILE.format(rank="*"), SO_FAR_FILE.format(rank="*")):
        for path in work.glob(pattern):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                fields, runs = read_runs(path)
                rank = int(fields["rank"])
                if rank in loaders:
                    continue  # what it wrote at its end stands
                loaders[rank], hosts[rank] = runs, str(fields["host"])
                if fields.get("so_far"):
                    so_far[rank] = max((run.report.recording.wall_s for run in runs), default=0.0)
    return loaders, hosts, so_far


def write_runs(out: Path, runs: list[LoaderRun], **fields: Any) -> None:
    """What a process measured (its loaders), with `fields` (its rank, its host...), written to `out` whole or not
    at all, for the process that launched it to read (read_runs). OSError or ValueError when it cannot be."""
    tmp = out.with_suffix(".tmp")
    tmp.write_text(runs_text(runs, **fields))
    tmp.replace(out)


def read_runs(path: Path) -> tuple[dict[str, Any], list[LoaderRun]]:
    """The fields and the loaders that write_runs wrote to `path` (OSError, ValueError, KeyError or TypeError when
    they cannot be read)."""
    return runs_from_text(path.read_text())


def joined(loaders: dict[int, list[LoaderRun]], hosts: dict[int, str], world_size: int) -> list[LoaderRun]:
    """Each rank's loaders, in rank order, with, for each loader made at one place in every rank
    ("train.py:41/rank0", "train.py:41/rank1"...), rank-straggler added to the slowest straggling rank's loader
    when there is one, and on the lowest rank's loader distributed-sampler when the ranks do not split the samples
    (or take different numbers of steps), the job's ceiling (`--ceiling`) and the DDP plan when it draws from a
    DistributedSampler."""
    by_site: dict[str, dict[int, LoaderRun]] = {}
    for rank, runs in sorted(loaders.items()):
        for run in runs:
            by_site.setdefault(run.report.name.removesuffix(f"/rank{rank}"), {})[rank] = run
    for ranks in by_site.values():
        finding = rank_straggler(
            {rank: run.report.recording for rank, run in ranks.items()},
            hosts,
            {rank: run.report.findings for rank, run in ranks.items()},
        )
        if finding is not None:
            slow = ranks[int(finding.evidence["rank"])].report
            slow.findings = order([*slow.findings, finding])
        first = ranks[min(ranks)].report
        facts = {rank: f for rank, run in ranks.items() if (f := recorded_facts(run.report.recording)) is not None}
        if (split := distributed_sampler(facts)) is not None:
            first.findings = order([*first.findings, split])
        ceilings = {rank: c for rank, run in ranks.items() if (c := run.report.recording.ceiling) is not None}
        if (job := job_ceiling(ceilings)) is not None:
            first.findings = order([*first.findings, job])
        first.plan = _plan(first.recording, world_size)
    return [run for _, runs in sorted(loaders.items()) for run in runs]


def _plan(rec: Recording, world_size: int) -> DdpPlan | None:
    """The DDP plan of a rank's loader, from its dataset, batch size and drop_lasts; None without a
    DistributedSampler (each rank then reads the whole dataset: no plan describes that) or a known size."""
    if rec.sampler_drop_last is None or not rec.dataset_len or not rec.batch_size:
        return None
    return ddp_plan(rec.dataset_len, rec.batch_size, world_size, drop_last=bool(rec.drop_last),
                    sampler_drop_last=rec.sampler_drop_last)  # fmt: skip


def ceiling_env(ceiling: bool | int, only: bool = False) -> str:
    """run's --ceiling (and --ceiling-only, as "stop:") as CEILING_ENV carries it to the processes of the job."""
    value = "" if ceiling is False else "default" if ceiling is True else str(ceiling)
    return f"stop:{value}" if value and only else value


def ceiling_from_env() -> bool | int:
    """The --ceiling of the run that started this process (see ceiling_env); False when there is none."""
    value = os.environ.get(CEILING_ENV, "").removeprefix("stop:")
    return True if value == "default" else int(value) if value.isdigit() else False


def ceiling_only_from_env() -> bool:
    """Whether the run that started this process stops once the ceiling is measured (--ceiling-only)."""
    return os.environ.get(CEILING_ENV, "").startswith("stop:")
