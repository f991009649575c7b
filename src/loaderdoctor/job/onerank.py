"""One rank of `run --nproc-per-node`/`--nnodes`, as torch's launcher starts it (`python -m loaderdoctor.job`:
job/__main__.py): the script run with its loaders watched, and what they measured sent to node 0 through the job's
store (job/meeting.py), or, when that store cannot be reached, written to a file of this node's run folder."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from loaderdoctor.job.gathering import rank_key, runs_text, so_far_key
from loaderdoctor.job.loaders import EveryLoader, LoaderRun
from loaderdoctor.job.meeting import STORE_ENV, store_client
from loaderdoctor.job.ranks import (
    GUARD_ENV,
    NAME_ENV,
    RANK_FILE,
    RUN_DIR_ENV,
    SO_FAR_FILE,
    RankEnds,
    ceiling_from_env,
    ceiling_only_from_env,
    write_runs,
)
from loaderdoctor.job.script import INTERRUPTED_STATUS, Script, ScriptRun, presses_of_ctrl_c, run_script
from loaderdoctor.tap.signals import SignalRaises, child_deaths_quiet, in_main_thread, release_interrupt

# How often a rank sends what it measured so far (at an epoch's end): a rank that ends abnormally leaves that. At
# most every SO_FAR_EVERY_S, and spaced so that sending takes at most SO_FAR_SHARE of the rank's time.
SO_FAR_EVERY_S = 10.0
SO_FAR_SHARE = 0.005


def rank_main(argv: list[str]) -> int:
    """One rank: the script run with its loaders watched, what they measured written for the launching node. A
    Ctrl-C (the launcher's, passed on) while the rank still imported ends it before its script starts (130,
    nothing to write)."""
    if release_interrupt():
        return INTERRUPTED_STATUS
    with presses_of_ctrl_c() as presses:
        return _run_rank(argv, presses)


def _run_rank(argv: list[str], presses: SignalRaises) -> int:
    module = bool(argv) and argv[0] == "-m"
    rest = argv[1:] if module else argv
    script = Script(rest[0], tuple(rest[1:]), module=module)
    rank = int(os.environ["RANK"])  # the launcher's; run_ranks launches only for a world of 2 ranks or more
    every = _RankLoaders(
        name=os.environ.get(NAME_ENV) or None,
        rank=rank,
        guarded=bool(os.environ.get(GUARD_ENV)),
        ceiling=ceiling_from_env(),
        ceiling_only=ceiling_only_from_env(),
    )
    run = run_script(script, every, presses)
    with child_deaths_quiet():  # torch's SIGCHLD handler would raise a dead worker's death again here
        return _write_rank_run(run, rank)


def _write_rank_run(run: ScriptRun, rank: int) -> int:
    """What the rank measured, sent to node 0 through the job's store (a file of this node's run folder when the
    store cannot be reached: node 0 gone); the rank's exit status."""
    fields = {"rank": rank, "host": socket.gethostname()}
    try:
        store_client(os.environ[STORE_ENV]).set(rank_key(rank), runs_text(run.loaders, **fields))
        return run.exit_status
    except Exception as error:  # the store's errors (their classes differ between torch versions), or no store
        sent = f"{type(error).__name__}: {error}"
    out = Path(os.environ[RUN_DIR_ENV]) / RANK_FILE.format(rank=rank)
    try:
        write_runs(out, run.loaders, **fields)
        print(f"loaderdoctor run: rank {rank} could not send what it measured to node 0 ({sent}); written on "
              "this node", file=sys.stderr)  # fmt: skip
    except (OSError, ValueError) as error:
        print(f"loaderdoctor run: rank {rank} could not send what it measured to node 0 ({sent}) nor write it "
              f"({error})", file=sys.stderr)  # fmt: skip
    return run.exit_status


class _RankLoaders(EveryLoader):
    """A rank's loaders. What they measured so far is sent to node 0 at the first epoch's end and then at most
    every SO_FAR_EVERY_S, as an epoch ends: a rank that is killed, or stuck in a collective with a node that was
    lost, leaves that much (job/gathering.py). Once its script has ended, SIGTERM and SIGINT no longer cut the rank
    short: the launcher sends SIGTERM to every rank when one fails, and a rank closing its watches or writing
    what they measured would lose it all; the rank ends right after anyway."""

    _store: Any = None
    _next_at: float | None = None  # when the next one may be sent (time.monotonic())
    _sending = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.signals_noted: list[int] = []  # those that came once the script had ended

    def epoch_ended(self) -> None:
        if self._next_at is None or time.monotonic() >= self._next_at:
            self.send_so_far()

    def send_so_far(self, **more: Any) -> None:
        """What this process measured so far sent now (and kept in this node's file), `more` written with it."""
        if not self._sending:
            return
        started = time.monotonic()
        places = self.so_far_places()
        if places is None:
            return
        out, key, fields = places
        try:
            text = runs_text(self.runs_so_far(), **fields, **more, so_far=True)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(out)  # this node's copy (for when node 0 is lost)
            if key is not None:
                self.so_far_store().set(key, text)
        except Exception as error:  # the store's errors, or a full disk: the process goes on, and says it at its end
            self._sending = False
            print(f"loaderdoctor run: process {os.getpid()} cannot keep what it measured so far "
                  f"({type(error).__name__}: {error})", file=sys.stderr)  # fmt: skip
            return
        took = time.monotonic() - started
        self._next_at = started + max(SO_FAR_EVERY_S, took / SO_FAR_SHARE)

    def so_far_store(self) -> Any:
        """The store that what this process measured so far is sent to (node 0's)."""
        if self._store is None:
            self._store = store_client(os.environ[STORE_ENV])
        return self._store

    def so_far_places(self) -> tuple[Path, str | None, dict[str, Any]] | None:
        """Where what this process measured so far goes: a file of this node's, the key in node 0's store (None:
        the file only), and the fields written with it; None when it has nowhere to go."""
        if self.rank is None or STORE_ENV not in os.environ or RUN_DIR_ENV not in os.environ:
            return None
        out = Path(os.environ[RUN_DIR_ENV]) / SO_FAR_FILE.format(rank=self.rank)
        return out, so_far_key(self.rank), {"rank": self.rank, "host": socket.gethostname()}

    def close(self) -> list[LoaderRun]:
        if in_main_thread():
            for signum in RankEnds.SIGNALS:
                signal.signal(signum, self._noted)
        return super().close()

    def _noted(self, signum: int, frame: Any) -> None:
        """A signal that comes while a rank ends: it ends anyway (a wait at its end is cut short)."""
        self.signals_noted.append(signum)
