"""One rank of a scale launch: joins the process group, builds the target's loaders, and measures each through
the probe while stepping together with the other ranks (a collective per step, as DDP's gradient all-reduce)."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from loaderdoctor.errors import LoaderDoctorError, StopMeasuring, UsageError
from loaderdoctor.loader.facts import loader_facts
from loaderdoctor.loader.settings import LoaderSpec
from loaderdoctor.loader.workload import Step
from loaderdoctor.plain.usercode import describe_exception
from loaderdoctor.probe.budget import deadline_allowance, target_limit_s
from loaderdoctor.probe.measuring import Measuring
from loaderdoctor.probe.session import ProbeSession
from loaderdoctor.scale.order import LaunchOrder
from loaderdoctor.scale.results import RankLoader, RankResult
from loaderdoctor.tap.fingerprints import sample_fingerprints
from loaderdoctor.targets import resolve as targets

# Fingerprints of delivered samples kept per rank, to compare the ranks' samples beside their indices (loader/facts.py).
MAX_FINGERPRINTS = 2048
# The measuring window runs until the ranks agree to stop; this only bounds it should the votes never come.
_WINDOW_LIMIT_FACTOR = 4.0


class RankStep:
    """The training step of a rank: the workload's step (or a sleep), then a collective with every other rank,
    which carries each rank's vote to stop. The ranks stop together at the first step where one of them has
    spent its budget, so that every rank runs the same number of steps and none waits forever on the others.

    A rank that leaves before the agreed stop (its loader stalled or crashed) calls farewell(), whose vote
    releases the others at their next step."""

    def __init__(self, inner: Step | None, budget_s: float, device: torch.device) -> None:
        self.inner = inner
        self.budget_s = budget_s
        self.device = device
        self.ends: float | None = None  # set at the first step: the budget counts once every rank has a batch
        self.stopped = False  # the ranks agreed to stop (or the group broke): no more collectives
        self.collective_error: str | None = None
        self.session: ProbeSession | None = None
        self.fingerprints: list[int] = []

    def __call__(self, batch: Any) -> None:
        self._fingerprint(batch)
        if self.inner is not None:
            self.inner(batch)
        now = time.monotonic()
        if self.ends is None:
            self.ends = now + self.budget_s
        if self._vote(now >= self.ends):
            raise StopMeasuring

    def farewell(self) -> None:
        """Leave the measuring before the agreed stop: one last vote to stop, matched by the others' step."""
        if not self.stopped:
            self._vote(True)

    def _vote(self, stop: bool) -> bool:
        vote = torch.tensor([1.0 if stop else 0.0], device=self.device)
        try:
            dist.all_reduce(vote, op=dist.ReduceOp.MAX)
        except RuntimeError as error:  # a rank died or stopped answering: gloo's timeout or a closed connection
            self.collective_error = describe_exception(error)
            self.stopped = True
            return True
        self.stopped = bool(vote.item() > 0)
        return self.stopped

    def _fingerprint(self, batch: Any) -> None:
        if self.session is None or len(self.fingerprints) >= MAX_FINGERPRINTS or not self.session.rec.batches:
            return
        found = sample_fingerprints(batch, self.session.rec.batches[-1].samples)
        if found is not None:
            self.fingerprints.extend(found[: MAX_FINGERPRINTS - len(self.fingerprints)])


def run_rank(order_json: str) -> dict[str, Any]:
    """The entry point the elastic launcher starts in every rank; returns every rank's result (as plain data)
    when the ranks could gather them, else this rank's alone. Never raises for a user's error: it is returned."""
    launch_order = LaunchOrder.from_json(order_json)
    # The launcher starts this process with multiprocessing's spawn, which makes spawn its default start method;
    # a rank of torchrun is a fresh interpreter with the platform's default: the workers must start as there.
    multiprocessing.set_start_method(None, force=True)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=launch_order.collective_timeout_s))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    result = RankResult(rank, local_rank, world_size, socket.gethostname(), os.getpid())
    try:
        _measure_target(launch_order, result, device)
        Path(launch_order.out_dir, f"rank-{rank}.json").write_text(json.dumps(result.to_dict()))
        if any(loader.collective_error for loader in result.loaders.values()):
            return {"results": [result.to_dict()]}  # the process group broke: nothing to gather over
        return {"results": _gathered(result)}
    finally:
        dist.destroy_process_group()


def _measure_target(launch_order: LaunchOrder, result: RankResult, device: torch.device) -> None:
    """Every loader of the target, one after the other; an error the user must fix goes into the result."""
    resolved = None
    try:
        resolved = targets.resolve_any(launch_order.target, "scale", target_limit_s(launch_order.budget_s))
        step = resolved.workload.training_step(launch_order.step_ms)
    except LoaderDoctorError as error:
        result.error, result.hint, result.usage_error = error.message, error.hint, isinstance(error, UsageError)
    except Exception as error:
        result.error = f"building the target raised {describe_exception(error)}"
        result.hint = "".join(traceback.format_exception(error)[-3:]).strip()
    try:
        if not _everyone_ready(result.error is None, device):
            if result.error is None:
                result.error = "another rank could not build the target: see its error"
            return
        assert resolved is not None
        budget_s = launch_order.budget_s / len(resolved.loaders)  # the launch's budget, shared by the loaders
        for name, loader in resolved.loaders.items():
            try:
                result.loaders[name] = _measure_loader(launch_order, loader, step, device, budget_s)
            except LoaderDoctorError as error:  # e.g. the training step raised: said, and the ranks stop
                result.error, result.hint = f"loader {name!r}: {error.message}", error.hint
            if name in result.loaders and result.loaders[name].collective_error is not None:
                return  # the process group broke: no more collectives
            if not _everyone_ready(result.error is None, device):
                return  # a rank failed, or the process group broke: no rank measures the next loader
    finally:
        if resolved is not None:
            resolved.close()


def _everyone_ready(ready: bool, device: torch.device) -> bool:
    """Whether every rank is ready to go on (one collective, so that no rank measures alone); False when the
    process group broke."""
    flag = torch.tensor([0.0 if ready else 1.0], device=device)
    try:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    except RuntimeError:
        return False
    return flag.item() == 0


def _measure_loader(
    launch_order: LaunchOrder, loader: DataLoader, inner: Step | None, device: torch.device, budget_s: float
) -> RankLoader:
    spec = LoaderSpec.from_loader(loader)
    step = RankStep(inner, budget_s, device)
    facts = loader_facts(loader, indices=True)
    session = None
    try:
        session = ProbeSession(Measuring(spec, step=step), spec.settings, lock_free=launch_order.lock_free)
        step.session = session
        if session.start(startup_limit_s=deadline_allowance(budget_s)) and not step.stopped:
            session.run(budget_s * _WINDOW_LIMIT_FACTOR + 30.0)
    finally:
        step.farewell()  # a rank whose loader stalled, crashed or could not be built releases the others
        if session is not None:
            recording = session.close()
    facts.fingerprints = step.fingerprints
    return RankLoader(recording, facts, step.collective_error)


def _gathered(result: RankResult) -> list[dict[str, Any]]:
    """Every rank's result, gathered over the process group (so that each node has them all); this rank's
    alone when a rank is gone."""
    mine = result.to_dict()
    everyone: list[Any] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(everyone, mine)
    except RuntimeError:
        return [mine]
    return [r for r in everyone if r is not None]
