"""What one Lightning fit keeps while LoaderDoctorCallback watches it (its loaders by key, their workers' census,
where the loop stands), and the readings the callback takes from the trainer and the main process."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loaderdoctor.host.forkhazards import iterator_facts
from loaderdoctor.integrations.trainer.census import WorkerCensus
from loaderdoctor.integrations.trainer.hooked import HookedLoader, Moment
from loaderdoctor.recording.record import IteratorFacts

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

    from loaderdoctor.integrations.lightning.ceiling import LightningCeiling


def dataloaders_of(iterables: Any) -> list[Any]:
    """The loaders of what a trainer iterates: one loader, or a list or dict of them (a combined loader)."""
    if iterables is None:
        return []
    if isinstance(iterables, Mapping):
        return [loader for value in iterables.values() for loader in dataloaders_of(value)]
    if isinstance(iterables, (list, tuple)):
        return [loader for value in iterables for loader in dataloaders_of(value)]
    return [iterables]


def batch_count(count: float | int | None) -> int | None:
    return None if count is None or math.isinf(count) else int(count)


class Fit:
    """What one fit keeps: a HookedLoader per loader (by key: "train", "val", "val_1"...), the census of their
    workers, and where the loop stands."""

    def __init__(self, base: str, trainer: Trainer) -> None:
        self.base = base
        self.census = WorkerCensus()
        self.loaders: dict[str, HookedLoader] = {}
        self.skipped: set[str] = set()  # keys whose loader cannot be measured (not a torch DataLoader)
        # The first epoch's start: the last hook before the trainer's iter() of the train loader, with the main
        # process's state then (the train loader is not built yet: its start method is filled in later).
        self.fit_start: tuple[Moment, IteratorFacts] = (moment(), iterator_facts(0, None))
        self.log_every = 1
        self.val_from: Moment | None = None  # when the validation run under way began (its iter())
        self.val_facts: IteratorFacts | None = None  # the main process's state then
        self.val_key: str | None = None  # the val loader whose batches come now
        self.steps_since_log = 0
        self.ceiling: LightningCeiling | None = None  # the train loader's data-free turns (ceiling=...)
        self.data_free: Moment | None = None  # the start of the training step under way on a batch handed again
        self.broken = False
        self.finished = False
        self.main = trainer.global_rank == 0

    @property
    def train(self) -> HookedLoader | None:
        return self.loaders.get("train")


def moment() -> Moment:
    return time.perf_counter(), time.process_time()


def facts_after_iter() -> IteratorFacts:
    """The main process's state just after a validation's iter(), less the pin-memory thread that iter() itself
    started once its workers were started (so no hazard to them)."""
    facts = iterator_facts(0, None)
    threads = [t for t in facts.threads if "_pin_memory_loop" not in f"{t.name} {t.runs}"]
    return dataclasses.replace(facts, threads=threads)
