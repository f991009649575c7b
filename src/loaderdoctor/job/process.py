"""A process of a `loaderdoctor run` job that made a DataLoader (a rank that Lightning, torchrun, accelerate,
mp.spawn or Ray Train started): its loaders watched as a `--nproc-per-node` rank's are, and written to the job's
folder when it exits (atexit; SIGTERM ends it as an exit, as it ends a rank's script). What it measured so far is
kept there too as its epochs end, and as it destroys its default process group: Ray Train's worker does so once
its training is over, then Ray ends it with no exit (no atexit)."""

from __future__ import annotations

import atexit
import functools
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data.dataloader import DataLoader as TorchDataLoader

from loaderdoctor.job.endmeeting import WAIT_S, meet_at_end, so_far_sent_key
from loaderdoctor.job.hook import RESULT_FILE, SO_FAR_RESULT_FILE, rank_from_environment, registered
from loaderdoctor.job.loaders import LoaderRun
from loaderdoctor.job.onerank import _RankLoaders
from loaderdoctor.job.places import rank_0_elsewhere, this_place
from loaderdoctor.job.ranks import GUARD_ENV, NAME_ENV, ceiling_from_env, ceiling_only_from_env, write_runs
from loaderdoctor.tap.signals import SignalRaises, child_deaths_quiet, in_main_thread

Register = Callable[[int | None], None]
FAILING_WAIT_S = 5.0  # how long rank 0 waits for the others at its end when it ends by an error or SIGTERM


def process_rank() -> int | None:
    """This process's rank: torch.distributed's once it is initialised for more than one rank (Lightning's and
    mp.spawn's ranks initialise it), else the one its launcher put in its environment; None for neither."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return int(dist.get_rank())
    except Exception:  # a process group being torn down: the environment's word
        pass
    return rank_from_environment()


def world_size() -> int | None:
    """The number of ranks of this process's job, when torch.distributed or the launcher's WORLD_SIZE says it."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        pass
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else None


def watch_here(folder: str, register: Register) -> JobProcessLoaders:
    """Watch every loader this process makes from now on, and write them to `folder` at its exit; `register`
    tells the job this process's rank once it is known."""
    every = JobProcessLoaders(Path(folder), register, name=os.environ.get(NAME_ENV) or None,
                              guarded=bool(os.environ.get(GUARD_ENV)), ceiling=ceiling_from_env(),
                              ceiling_only=ceiling_only_from_env())  # fmt: skip
    made = TorchDataLoader.__dict__["__init__"]
    every.install()
    # The job hook's DataLoader.__init__ notes every loader made (see jobhook._wrap), not the watch's: Lightning
    # puts back the __init__ it found when it made the loader that started this watch, the watch's hook with it.
    TorchDataLoader.__init__ = made  # type: ignore[method-assign]
    if in_main_thread():  # unless the program has a handler of its own: SIGTERM is an exit, atexit then writes
        every.terminated = SignalRaises(signal.SIGTERM, _exit)
        every.terminated.install()
    atexit.register(every.write)
    _keep_as_the_group_ends(every)
    return every


def _keep_as_the_group_ends(every: JobProcessLoaders) -> None:
    """torch.distributed.destroy_process_group() of the default group keeps what `every` measured so far first (a
    rank's training is over: Ray Train's worker is ended right after, with no exit)."""
    dist = sys.modules.get("torch.distributed")
    original = getattr(dist, "destroy_process_group", None)
    if original is None or getattr(original, "_loaderdoctor_keeps", False):
        return

    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> None:
        if group is None and os.getpid() == every.pid:
            every.left_group()
        original(group)

    destroy_process_group._loaderdoctor_keeps = True  # type: ignore[attr-defined]
    dist.destroy_process_group = destroy_process_group  # type: ignore[union-attr]


def _say(text: str) -> None:
    print(f"loaderdoctor run: {text}", file=sys.stderr, flush=True)


def _exit(signum: int) -> BaseException:
    return SystemExit(128 + signum)


class JobProcessLoaders(_RankLoaders):
    """A job process's loaders, named with its rank ("train.py:41/rank1") once the rank is known: at a loader's
    first iter(), a rank's process group is usually initialised. Its close() is a rank's (a signal while it
    writes is noted, not obeyed)."""

    def __init__(
        self,
        folder: Path,
        register: Register,
        *,
        name: str | None,
        guarded: bool,
        ceiling: bool | int = False,
        ceiling_only: bool = False,
    ) -> None:
        self._known_rank: int | None = None
        self._register = register
        super().__init__(name=name, guarded=guarded, ceiling=ceiling, ceiling_only=ceiling_only)
        self.folder = folder
        self.joined_by = str(folder)
        self.pid = os.getpid()
        self._rank_0_elsewhere: bool | None = None  # known once rank 0 was watched
        self.terminated: SignalRaises | None = None  # SIGTERM made an exit (watch_here)

    @property  # type: ignore[override]
    def rank(self) -> int | None:
        if self._known_rank is None:
            self._known_rank = process_rank()
            if self._known_rank is not None:
                self._register(self._known_rank)  # a rank that dies from here on is named by its rank
        return self._known_rank

    @rank.setter
    def rank(self, value: int | None) -> None:
        self._known_rank = value

    def note(self, loader: Any, frame: Any) -> None:
        """Note where the user's code made `loader` (`frame` called DataLoader.__init__)."""
        if self.active:
            self._note_site(loader, frame)

    def so_far_places(self) -> tuple[Path, str | None, dict[str, Any]] | None:
        """What this process measured so far goes to the job's folder, read when it writes nothing at its exit
        (killed, os._exit: a Ray worker ended by Ray); and to the job's store when another `run` joins rank 0, which
        gathers this rank at the job's end (job/endmeeting.py)."""
        fields = {"pid": self.pid, "rank": self.rank, "host": socket.gethostname(), "world_size": world_size()}
        key = None
        if self.job is not None and self._rank_0_elsewhere is None:
            try:
                self._rank_0_elsewhere = rank_0_elsewhere(self.job, this_place(self.joined_by))
            except Exception:  # the store's errors: kept in the folder only
                self._rank_0_elsewhere = False
        if self.job is not None and self._rank_0_elsewhere:
            key = so_far_sent_key(self.job.rank)
        return self.folder / SO_FAR_RESULT_FILE.format(pid=self.pid), key, fields

    def so_far_store(self) -> Any:
        assert self.job is not None
        return self.job.store

    def left_group(self) -> None:
        """The process leaves its default process group: what it measured so far is kept now, whenever it was kept
        last. Never raises."""
        try:
            if self.active:
                self.send_so_far(left_group=True)
        except Exception as error:  # the group goes on to its end
            print(f"loaderdoctor: process {self.pid} could not keep what it measured: {type(error).__name__}: "
                  f"{error}", file=sys.stderr)  # fmt: skip

    def write(self) -> None:
        """End every watch and write what they measured for the job (at this process's exit; a forked child's
        exit writes nothing). Never raises: a failure is one line on stderr."""
        if os.getpid() != self.pid:
            return
        try:
            with child_deaths_quiet():  # torch's SIGCHLD handler would raise a dead worker's death again here
                runs = self.close()
            met = self._meet_at_end(runs)
            out = self.folder / RESULT_FILE.format(pid=self.pid)
            write_runs(out, runs, pid=self.pid, rank=self.rank, host=socket.gethostname(), world_size=world_size(),
                       **met)  # fmt: skip
        except Exception as error:
            print(f"loaderdoctor: process {self.pid} could not write what it measured: {type(error).__name__}: "
                  f"{error}", file=sys.stderr)  # fmt: skip

    def _meet_at_end(self, runs: list[LoaderRun]) -> dict[str, Any]:
        """When this process is a rank of a job that other `loaderdoctor run`s watch too (one per node): on rank 0,
        what the others sent, gathered (job/endmeeting.py) for this run to join; on the others, where their
        diagnosis went. What this process writes for that, with what it measured."""
        if self.job is None:
            return {}
        # A rank that ends by an uncaught exception (a peer's death broke its collective) or by SIGTERM (its launcher
        # ends the job) waits little for the others.
        failing = getattr(sys, "last_value", None) is not None or (
            self.terminated is not None and self.terminated.received is not None
        )
        here = {fields["rank"] for fields in registered(self.folder).values() if isinstance(fields.get("rank"), int)}
        met = meet_at_end(self.job, runs, here, here=this_place(self.joined_by), say=_say,
                          wait_s=FAILING_WAIT_S if failing else WAIT_S,
                          stopped=lambda: bool(self.signals_noted))  # fmt: skip
        if met.sent:
            return {"sent_to": met.rank0_host}
        written: dict[str, Any] = {"meeting_notes": met.notes()} if met.notes() else {}
        if met.loaders:
            written["gathered"] = {str(rank): {"host": met.hosts.get(rank, ""), "loaders": [r.to_dict() for r in rs]}
                                   for rank, rs in met.loaders.items()}  # fmt: skip
        return written
