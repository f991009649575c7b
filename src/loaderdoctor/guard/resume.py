"""How a guarded loader resumes its epoch, for each kind of dataset behind one small protocol: a map-style
dataset by its batch plan (PlanResume), an IterableDataset by its workers' stream states (StreamResume). Each
builds the guard's internal loader, prepares each new iterator, takes each batch delivered, and saves and loads
its part of state_dict()."""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.batchplan import EpochPlan, PlannedBatchSampler, generator_states, plan_generators, replayed
from loaderdoctor.guard.inner import Inner
from loaderdoctor.guard.samples import GuardedSamples, SkipReports, Tagger
from loaderdoctor.guard.state import ITERABLE, STATE_VERSION, checked_state, checked_stream_state, dataset_length
from loaderdoctor.guard.streams import GuardedStream, StreamCollate, StreamRecord, StreamWorkerInit
from loaderdoctor.guard.workerview import UsersDatasetHook
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.plain.words import plural
from loaderdoctor.tap.events import Listener
from loaderdoctor.tap.iterator import RecentWaits, Tap, starts_workers
from loaderdoctor.workers.currentindex import InHand
from loaderdoctor.workers.poller import StackDumpHook

log = logging.getLogger("loaderdoctor")


@dataclass(frozen=True)
class Standing:
    """Where a guarded loader stands, in what both kinds of state_dict() hold."""

    epoch: int  # the epoch the next batch belongs to
    position: int  # its batches delivered
    mid_epoch: bool  # begun, with batches left to deliver
    seed_state: torch.Tensor | None  # the state the workers' base seed is drawn from
    restarts: int
    skipped: list[int]
    samples_seen: int


@dataclass(frozen=True)
class Loaded:
    """What load_state_dict() sets on the guarded loader."""

    epoch: int  # the epoch the next iter() resumes (mid_epoch) or starts
    position: int
    mid_epoch: bool
    seed_state: torch.Tensor | None
    restarts: int
    skipped: list[int] | None = None  # None: kept as it is (not in an IterableDataset's state)
    samples_seen: int | None = None


@dataclass(frozen=True)
class Building:
    """What the guard hands a Resume to build its internal loader with."""

    spec: LoaderSpec
    settings: Settings
    generator: torch.Generator  # the workers' base seed is drawn from it
    stack_dir: Callable[[], str]  # the guard's temporary folder, made when first asked for
    waits: RecentWaits  # shared by every internal loader: the watchdog's yardstick
    listeners: list[Listener]  # the guard's: every internal loader's tap reports to them (a watch, say)


class Resume(Protocol):
    """What differs between the two kinds of dataset in a guarded loader's life."""

    per_worker_streams: bool  # the saved states map onto as many workers only

    def start(self, plan: EpochPlan) -> None: ...
    def length(self) -> int | None: ...
    def ends_at(self, position: int) -> bool: ...
    def build(self, building: Building) -> Inner: ...
    def stale(self, inner: Inner) -> bool: ...
    def prepare(self, inner: Inner, position: int) -> None: ...
    def delivered(self, batch: Any, position: int) -> tuple[Any, Any]: ...
    def indices(self, position: int) -> Any: ...
    def state(self, standing: Standing, num_workers: int) -> dict[str, Any]: ...
    def load(self, state: dict[str, Any], num_workers: int) -> Loaded: ...
    def restart_words(self, settings: Settings) -> tuple[str, dict[str, Any]]: ...
    def gave_up_words(self, settings: Settings) -> str: ...
    def skip_killer(self, index: int | None, death: str) -> bool: ...


def _tap(loader: DataLoader, building: Building) -> Tap:
    tap = Tap(loader, building.listeners, start_method=building.settings.effective_start_method)
    tap.waits = building.waits
    return tap


def _stack_hook(building: Building) -> StackDumpHook | None:
    return StackDumpHook(building.stack_dir()) if building.settings.num_workers else None


def _generator_states(loader: DataLoader) -> dict[str, list[int]]:
    return {place: state.tolist() for place, state in generator_states(loader).items()}


def _set_generators(loader: DataLoader, states: dict[str, torch.Tensor]) -> None:
    for place, generator in plan_generators(loader).items():
        generator.set_state(states[place])


class PlanResume:
    """A map-style dataset: each epoch's batches are drawn from the user's sampler as loading asks for them
    (guard/batchplan.py); a restart replays those not yet delivered. Under on_sample_error="skip" each request is
    tagged, and the dataset wrapper reports what it replaced (guard/samples.py)."""

    per_worker_streams = False

    def __init__(self, loader: DataLoader, *, skip: bool) -> None:
        self.loader = loader
        self.skip = skip
        self.plan = EpochPlan(None, length=0)
        self.killers: dict[int, str] = {}  # under skip: indices that killed a worker, never loaded again

    def skip_killer(self, index: int | None, death: str) -> bool:
        """Under on_sample_error="skip": never load `index` again (it killed a worker); whether it will be."""
        if not self.skip or index is None:
            return False
        self.killers[index] = death
        return True

    def start(self, plan: EpochPlan) -> None:
        self.plan = plan

    def length(self) -> int | None:
        return self.plan.length

    def ends_at(self, position: int) -> bool:
        return self.plan.ends_at(position)

    def build(self, building: Building) -> Inner:
        spec, settings = building.spec, building.settings
        sampler = PlannedBatchSampler()
        planned = {"batch_sampler": sampler} if spec.batch_sampler is not None else {"sampler": sampler}
        spec = dataclasses.replace(spec, generator=building.generator, **planned)
        reports = SkipReports(building.stack_dir()) if self.skip else None
        in_hand = InHand(building.stack_dir(), settings.num_workers) if settings.num_workers else None
        dataset = GuardedSamples(spec.dataset, None if reports is None else reports.path, in_hand, self.killers)
        hook = UsersDatasetHook(_stack_hook(building), dataset.inner, in_hand)
        loader = spec.build(settings, dataset=dataset, worker_hook=hook)
        return Inner(loader, sampler, settings, _tap(loader, building), reports, in_hand=in_hand)

    def stale(self, inner: Inner) -> bool:
        return False  # workers alive from the epoch before take the next plan as they are

    def prepare(self, inner: Inner, position: int) -> None:
        tag = None if inner.reports is None else Tagger(inner.iteration)
        inner.sampler.replan(self.plan, position, tag)

    def delivered(self, batch: Any, position: int) -> tuple[Any, Any]:
        """The user's batch and its indices, now delivered."""
        return batch, self.plan.delivered(position)

    def indices(self, position: int) -> Any:
        """The dataset indices of the batch at `position`, not yet delivered (None when not known)."""
        try:
            return self.plan.batch(position)
        except IndexError:
            return None

    def state(self, standing: Standing, num_workers: int) -> dict[str, Any]:
        mid = standing.mid_epoch
        if mid:
            generators, global_state = self.plan.starting_states()
        else:
            generators, global_state = generator_states(self.loader), None
        return {
            "version": STATE_VERSION,
            "dataset_length": dataset_length(self.loader),
            "batch_size": self.loader.batch_size,
            "epoch": standing.epoch,
            "position": standing.position if mid else 0,
            "epoch_started": mid,
            "generators": {place: state.tolist() for place, state in generators.items()},
            "global_generator": None if global_state is None else global_state.tolist(),
            "seed_state": None if standing.seed_state is None else standing.seed_state.tolist(),
            "restarts": standing.restarts,
            "skipped": list(standing.skipped),
            "samples_seen": standing.samples_seen,
        }

    def load(self, state: dict[str, Any], num_workers: int) -> Loaded:
        checked = checked_state(state, self.loader)
        epoch, position, started = checked["epoch"], checked["position"], checked["epoch_started"]
        if started:
            before = generator_states(self.loader)
            try:
                plan = replayed(
                    self.loader, checked["generators"], checked["global_generator"], position, checked["seed_state"]
                )
            except UsageError:
                _set_generators(self.loader, before)  # refused: nothing changed
                raise
            self.plan = plan
            of = "" if plan.length is None else f" of {plan.length}"
            log.info(
                "loaderdoctor guard: state loaded: the next iter() resumes epoch %d at batch %d%s", epoch, position, of
            )
        else:
            _set_generators(self.loader, checked["generators"])
            self.plan = EpochPlan(None, length=0)
            log.info("loaderdoctor guard: state loaded: the next iter() starts epoch %d", epoch)
        return Loaded(
            epoch,
            position,
            started,
            checked["seed_state"],
            checked["restarts"],
            checked["skipped"],
            checked["samples_seen"],
        )

    def restart_words(self, settings: Settings) -> tuple[str, dict[str, Any]]:
        return "", {}

    def gave_up_words(self, settings: Settings) -> str:
        return ""


class StreamResume:
    """An IterableDataset with state_dict()/load_state_dict(): each batch carries, from the process that loaded it,
    its worker's id and the dataset's state right after its samples (guard/streams.py); a restart loads each new
    worker with the state of the stream it continues, rotated so that the deal goes on where it stood."""

    per_worker_streams = True

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.streams = StreamRecord()

    def skip_killer(self, index: int | None, death: str) -> bool:
        return False  # a stream's items have no index to skip by

    def start(self, plan: EpochPlan) -> None:
        self.streams.reset()

    def length(self) -> int | None:
        return None

    def ends_at(self, position: int) -> bool:
        return False  # the dataset decides where the epoch ends

    def build(self, building: Building) -> Inner:
        spec, settings = building.spec, building.settings
        stream = GuardedStream(spec.dataset)
        spec = dataclasses.replace(
            spec,
            generator=building.generator,
            collate_fn=StreamCollate(spec.collate_fn, stream),
            worker_init_fn=StreamWorkerInit(spec.worker_init_fn, stream),
        )
        hook = UsersDatasetHook(_stack_hook(building), stream.inner)
        loader = spec.build(settings, dataset=stream, worker_hook=hook)
        return Inner(loader, None, settings, _tap(loader, building), stream=stream)

    def stale(self, inner: Inner) -> bool:
        """Whether persistent workers kept from the epoch before must be replaced: they were started as other
        streams, or the streams resume from saved states (new workers deal from worker 0)."""
        if not inner.settings.num_workers or starts_workers(inner.loader):
            return False
        return inner.rotation != self.streams.rotation(inner.settings.num_workers) or bool(self.streams.states)

    def prepare(self, inner: Inner, position: int) -> None:
        if not inner.settings.num_workers or starts_workers(inner.loader):
            # What the iterator's new workers (or the main process) resume from: see guard/streams.py.
            inner.stream.rotation = inner.rotation = self.streams.rotation(inner.settings.num_workers)
            inner.stream.resume = dict(self.streams.states) or None

    def delivered(self, batch: Any, position: int) -> tuple[Any, Any]:
        """The user's batch out of the tagged one; its stream's state kept."""
        return self.streams.delivered(batch), None

    def indices(self, position: int) -> Any:
        return None  # a stream has no indices

    def state(self, standing: Standing, num_workers: int) -> dict[str, Any]:
        mid = standing.mid_epoch
        return {
            "version": STATE_VERSION,
            "dataset": ITERABLE,
            "dataset_length": dataset_length(self.loader),
            "batch_size": self.loader.batch_size,
            "num_workers": num_workers,
            "epoch": standing.epoch,
            "position": standing.position if mid else 0,
            "last_worker": self.streams.last if mid else None,
            "worker_states": {str(stream): copy.deepcopy(s) for stream, s in sorted(self.streams.states.items())}
            if mid
            else None,
            "generators": _generator_states(self.loader),
            "seed_state": None if standing.seed_state is None else standing.seed_state.tolist(),
            "restarts": standing.restarts,
        }

    def load(self, state: dict[str, Any], num_workers: int) -> Loaded:
        checked = checked_stream_state(state, self.loader, num_workers)
        _set_generators(self.loader, checked["generators"])
        epoch, states = checked["epoch"], checked["worker_states"]
        if states is None:
            self.streams.reset()
            log.info("loaderdoctor guard: state loaded: the next iter() starts epoch %d", epoch)
            return Loaded(epoch, 0, False, checked["seed_state"], checked["restarts"])
        self.streams.restore(states, checked["last_worker"])
        log.info(
            "loaderdoctor guard: state loaded: the next iter() resumes epoch %d after %s, the streams of "
            "workers %s where their last batch delivered left them",
            epoch,
            plural(checked["position"], "batch"),
            ", ".join(map(str, sorted(states))) or "none",
        )
        return Loaded(epoch, checked["position"], True, checked["seed_state"], checked["restarts"])

    def restart_words(self, settings: Settings) -> tuple[str, dict[str, Any]]:
        detail = {
            "streams": {"resumed": sorted(self.streams.states), "first": self.streams.rotation(settings.num_workers)}
        }
        return " (each worker's stream right after its last batch delivered)", detail

    def gave_up_words(self, settings: Settings) -> str:
        if settings.num_workers <= 1:
            return ""
        return (
            " No rung is left: an IterableDataset's workers each iterate their own stream, whose states resume on as "
            "many workers only."
        )
