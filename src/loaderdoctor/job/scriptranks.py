"""When the script `run` runs is itself one rank of a distributed job that something else started (`srun` with a
task per rank, a Kubernetes PyTorchJob, `loaderdoctor run train.py` typed on every machine): at their end the ranks
meet in the job's own store (the process group's, as the first loader was iterated: watch/rankceilings.py), each
puts what it measured there, and rank 0 gathers the others' (a bounded wait, said) and diagnoses the job; the
others say where that is. Ranks that the job's folder already joined (Lightning's rank 1, a torchrun the script
ran) are not waited for."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loaderdoctor.job.gathering import read_sent, runs_text
from loaderdoctor.job.loaders import LoaderRun
from loaderdoctor.watch.rankceilings import JobStore

WAIT_S = 60.0  # the longest rank 0 waits for the others, in all
SAY_AFTER_S = 3.0
SAY_EVERY_S = 10.0
KEY_PREFIX = "loaderdoctor/run/script/"


@dataclass
class ScriptRanks:
    """What rank 0 gathered: each rank's loaders and host, and the ranks that sent nothing within the wait; on the
    other ranks, `sent_to` is rank 0's word: the diagnosis is there."""

    loaders: dict[int, list[LoaderRun]] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    sent: bool = False
    problems: list[str] = field(default_factory=list)


def meet_at_end(
    job: JobStore,
    runs: list[LoaderRun],
    have: set[int],
    *,
    say: Callable[[str], None],
    wait_s: float = WAIT_S,
    clock: Callable[[], float] = time.monotonic,
) -> ScriptRanks:
    """This rank's `runs` put in the job's store; on rank 0, the other ranks' gathered (those in `have` are not
    waited for), waiting `wait_s` in all. A store that cannot be reached leaves each rank with its own."""
    met = ScriptRanks()
    key = f"{KEY_PREFIX}{job.rank}"
    try:
        if job.rank != 0:
            job.store.set(key, runs_text(runs, rank=job.rank, host=socket.gethostname()))
            met.sent = True
            return met
    except Exception as error:  # rank 0 gone: this rank keeps its own diagnosis
        met.problems.append(f"could not send what this rank measured to rank 0 ({type(error).__name__}: {error})")
        return met
    started = told_at = clock()
    waiting = [rank for rank in range(job.world) if rank != 0 and rank not in have]
    while waiting:
        for rank in list(waiting):
            try:
                sent = read_sent(job.store, f"{KEY_PREFIX}{rank}")
                if sent is None:
                    continue
                met.loaders[rank], met.hosts[rank] = sent[1], str(sent[0].get("host", ""))
            except Exception as error:  # a damaged text, or the store's errors
                met.problems.append(f"what rank {rank} sent could not be read ({type(error).__name__}: {error})")
            waiting.remove(rank)
        now = clock()
        if not waiting or now - started >= wait_s:
            break
        if now - started >= SAY_AFTER_S and (told_at == started or now - told_at >= SAY_EVERY_S):
            told_at = now
            ranks = ("ranks " if len(waiting) > 1 else "rank ") + ", ".join(map(str, waiting))
            they = "they" if len(waiting) > 1 else "it"
            say(f"waiting for {ranks} to send what {they} measured (each rank run under loaderdoctor run), "
                f"{now - started:.0f} s of {wait_s:g}")  # fmt: skip
        time.sleep(0.1)
    met.missing = waiting
    return met
