"""When the ranks of one distributed job are watched by several `loaderdoctor run`s (one typed on every node around
torchrun or accelerate launch, `srun` with a task per rank, a Kubernetes PyTorchJob): at their end they meet in
the job's own store (the process group's, as the first loader was iterated: watch/rankceilings.py). Each rank that
another `run` joins puts what it measured there, and rank 0 gathers them (a bounded wait, said) so that its `run`
diagnoses the job; their own `run`s say where that is. The ranks that rank 0's own `run` joins, and those that were
never watched (job/places.py), are not waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loaderdoctor.job.gathering import read_sent, runs_text
from loaderdoctor.job.loaders import LoaderRun
from loaderdoctor.job.places import KEY_PREFIX, host_of, places
from loaderdoctor.watch.rankceilings import JobStore

WAIT_S = 60.0  # the longest rank 0 waits for the others, in all
SAY_AFTER_S = 3.0
SAY_EVERY_S = 10.0


def sent_key(rank: int) -> str:
    return f"{KEY_PREFIX}{rank}"


def so_far_sent_key(rank: int) -> str:
    """Where a rank that rank 0 gathers puts what it measured so far, as its epochs end (job/process.py)."""
    return f"{KEY_PREFIX}so-far/{rank}"


@dataclass
class EndMeeting:
    """What rank 0 gathered: each rank's loaders and host, the ranks that sent nothing within the wait, and those
    never watched under `loaderdoctor run`; on the other ranks, `sent` when rank 0 has what they measured (its host
    in `rank0_host`)."""

    loaders: dict[int, list[LoaderRun]] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    unwatched: list[int] = field(default_factory=list)
    sent: bool = False
    rank0_host: str = ""
    problems: list[str] = field(default_factory=list)
    wait_s: float = WAIT_S
    world: int = 0
    so_far: dict[int, float] = field(default_factory=dict)  # of `missing`: the seconds they sent as epochs ended

    def notes(self) -> list[str]:
        """What rank 0's diagnosis leaves out, and why, in words."""
        said = list(self.problems)
        for rank in self.missing:
            if rank in self.so_far:
                said.append(f"rank {rank} sent nothing at its end within {self.wait_s:g} s: its diagnosis covers its "
                            f"first {self.so_far[rank]:.1f} s, as it sent them when an epoch ended")  # fmt: skip
            else:
                said.append(f"rank {rank} sent nothing within {self.wait_s:g} s (it ended before it could, or still "
                            "runs): the job's diagnosis leaves it out")  # fmt: skip
        if self.unwatched:
            ranks = ("ranks " if len(self.unwatched) > 1 else "rank ") + _listed(self.unwatched)
            said.append(f"{ranks} of the job's {self.world} {'were' if len(self.unwatched) > 1 else 'was'} not "
                        "watched (not run under loaderdoctor run, or no DataLoader iterated there): the job's "
                        "diagnosis leaves them out")  # fmt: skip
        return said


def meet_at_end(
    job: JobStore,
    runs: list[LoaderRun],
    have: set[int],
    *,
    here: str,
    say: Callable[[str], None],
    wait_s: float = WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    stopped: Callable[[], bool] = lambda: False,
) -> EndMeeting:
    """This rank's `runs` put in the job's store when another `run` than rank 0's joins it (this rank's place is
    `here`: job/places.py); on rank 0, those the other ranks put there gathered, waiting `wait_s` in all for the
    ranks that were watched elsewhere (`have`: the ranks rank 0's `run` holds, not waited for). `stopped()` true,
    or Ctrl-C, ends the wait with what came. A store that cannot be reached leaves each rank with its own."""
    met = EndMeeting(wait_s=wait_s, world=job.world)
    try:
        placed = places(job, [0] if job.rank != 0 else range(job.world))
        if job.rank != 0:
            if placed.get(0) == here:
                return met  # rank 0's run joins this rank's
            if 0 not in placed:
                met.problems.append("rank 0 was not watched under loaderdoctor run: this diagnosis is of this "
                                    "run's ranks only")  # fmt: skip
                return met
            job.store.set(sent_key(job.rank), runs_text(runs, rank=job.rank, host=host_of(here)))
            met.sent, met.rank0_host = True, host_of(placed[0])
            return met
    except Exception as error:  # rank 0 gone: this rank keeps its own diagnosis
        met.problems.append(f"could not send what this rank measured to rank 0 ({type(error).__name__}: {error})")
        return met
    met.unwatched = [rank for rank in range(1, job.world) if rank not in placed and rank not in have]
    waiting = [rank for rank, place in sorted(placed.items()) if rank != 0 and place != here and rank not in have]
    try:
        _gather(job, met, waiting, say, wait_s, clock, stopped)
    except KeyboardInterrupt:
        met.problems.append("Ctrl-C ended the wait for the other ranks")
    for rank in met.missing:  # what they sent as their epochs ended stands for them
        try:
            sent = read_sent(job.store, so_far_sent_key(rank))
            if sent is not None and sent[1]:
                met.loaders[rank], met.hosts[rank] = sent[1], str(sent[0].get("host", ""))
                met.so_far[rank] = max(run.report.recording.wall_s for run in sent[1])
        except Exception as error:  # a damaged text, or the store's errors
            met.problems.append(f"what rank {rank} sent so far could not be read ({type(error).__name__}: {error})")
    return met


def _gather(
    job: JobStore,
    met: EndMeeting,
    waiting: list[int],
    say: Callable[[str], None],
    wait_s: float,
    clock: Callable[[], float],
    stopped: Callable[[], bool],
) -> None:
    """Into `met`, what each rank of `waiting` sends within `wait_s`; `waiting` keeps those that sent nothing."""
    started = told_at = clock()
    met.missing = waiting
    while waiting:
        for rank in list(waiting):
            try:
                sent = read_sent(job.store, sent_key(rank))
                if sent is None:
                    continue
                met.loaders[rank], met.hosts[rank] = sent[1], str(sent[0].get("host", ""))
            except Exception as error:  # a damaged text, or the store's errors
                met.problems.append(f"what rank {rank} sent could not be read ({type(error).__name__}: {error})")
            waiting.remove(rank)
        now = clock()
        if not waiting or now - started >= wait_s:
            return
        if stopped():
            met.problems.append("a signal ended the wait for the other ranks")
            return
        if now - started >= SAY_AFTER_S and (told_at == started or now - told_at >= SAY_EVERY_S):
            told_at = now
            they = "they" if len(waiting) > 1 else "it"
            say(f"waiting for {'ranks' if len(waiting) > 1 else 'rank'} {_listed(waiting)} to send what {they} "
                f"measured, {now - started:.0f} s of {wait_s:g}")  # fmt: skip
        time.sleep(0.1)


def _listed(ranks: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, ranks[:most]))
    return shown + (f" and {len(ranks) - most} more" if len(ranks) > most else "")
