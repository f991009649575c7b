"""What the guard's workers show the user's code: get_worker_info().dataset is the user's dataset, not the
guard's wrapper around it, so that `isinstance(get_worker_info().dataset, MyDataset)` holds as with torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch.utils.data._utils import worker as torch_worker

from loaderdoctor.guard.lifeline import Lifeline


def show_dataset(dataset: Any) -> None:
    """In a worker: make get_worker_info().dataset be `dataset` (torch's WorkerInfo cannot be changed in place:
    a copy replaces it)."""
    info = torch_worker._worker_info
    if info is None or info.dataset is dataset:
        return
    if dataclasses.is_dataclass(info):
        shown = dataclasses.replace(info, dataset=dataset)
    else:  # torch before 2.6: a plain class
        shown = type(info)(id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=dataset)
    torch_worker._worker_info = shown


class UsersDatasetHook:
    """Runs first in each worker (worker_hook of LoaderSpec.build): the worker's life tied to the training
    process's (guard/lifeline.py), the guard's own hook, the worker's slot of `in_hand` mapped
    (workers/currentindex.py), then the user's dataset shown in get_worker_info(). Pickled with the wrapper, so
    `dataset` and `in_hand` are the worker's copies of the ones the wrapper holds."""

    def __init__(self, hook: Callable[[int], None] | None, dataset: Any, in_hand: Any = None) -> None:
        self.hook = hook
        self.dataset = dataset
        self.in_hand = in_hand
        self.lifeline = Lifeline()  # made where the loader is built: in the training process

    def __call__(self, worker_id: int) -> None:
        self.lifeline.hold()
        if self.hook is not None:
            self.hook(worker_id)
        if self.in_hand is not None:
            self.in_hand.attach(worker_id)
        show_dataset(self.dataset)
