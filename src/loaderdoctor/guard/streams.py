"""IterableDataset resume under the guard: the wrappers that tag each batch with the stream it came from and
the dataset's state right after its samples, and the main process's record of the last batch delivered from
each stream.

There is no batch plan for an iterable dataset: each worker iterates its own copy of it (its stream, usually a
shard chosen by get_worker_info().id), and torch deals the batches out in turn. The guard counts the batches
delivered and, per stream, keeps the state of the last one delivered; a restart makes each new worker load the
state of the stream it continues before it iterates.

The dataset's part (what "offers state_dict()/load_state_dict()" must mean):
- state_dict() returns where its current iteration stands, right after the samples fetched so far, as picklable
  data (JSON-ready, if the guard's own state_dict() is to be saved as JSON). The guard calls it once per batch,
  in the process that loaded the batch, inside collate (right after the fetch), and deep-copies what it returns.
- load_state_dict(state) makes its next iter() continue right after those samples, and yield nothing when the
  state is at the end of its stream.
- An iter() without load_state_dict() before it starts the stream from its beginning, as under the plain loader.
- With no workers or one, the whole stream is one state: a dataset is expected to give the same stream in the
  main process (get_worker_info() is None) as in the only worker (worker 0 of 1), as torch's own examples do.

How a batch travels: StreamCollate runs the user's collate_fn, then wraps its result in a StreamBatch with the
stream's id and state; the guard's next() takes the user's batch out of it and hands over exactly what the plain
DataLoader would. torch's pin-memory thread pins the batch inside (StreamBatch.pin_memory).

Order after a restart. torch deals an iterable dataset's batches in rounds: each worker in turn (0, 1, ...,
N-1, 0, ...) is asked for the next batch of its stream, and batches are delivered in the order asked. A worker
whose stream has ended answers nothing from then on (or is no longer asked): its turn passes. So the plain
loader delivers the batches of each round, worker by worker, and the order is fixed by the streams alone, however
fast the workers are. A new torch iterator starts its deal at worker 0 again. Instead, the guard presents worker i
of the new iterator to the user's dataset, its worker_init_fn and get_worker_info() as worker (i + r) mod N,
where r = (last + 1) mod N is the stream after the one of the last batch delivered (StreamWorkerInit): that
worker's id, its seed, and the random, torch and numpy generators seeded as torch seeds that worker at its start.
The turns then go on exactly where they stopped, each stream continuing from its last batch delivered: the plain
loader's batches in the plain loader's order, for any number of workers and streams of any lengths. (This is
torch's default in_order=True; the guard's own loaders always deliver in order.) Persistent workers started
rotated (r != 0) are ended at their epoch's end, so that the next epoch deals from worker 0 like the plain
loader's.

A stream that had already ended (its worker exhausted, or exhausted once its last batch was delivered): its last
state is at its end, so after load_state_dict() its iter() yields nothing; the new iterator's first request to
that worker ends it, and torch deals on among the others, as the plain loader does once a stream ends. A stream
with no batch delivered in this epoch is not loaded: its worker's iter() starts it from its beginning.

Not restored: what a persistent worker's copy of the dataset carried over from an earlier epoch beyond its state
(a restarted worker gets a fresh copy, as a non-persistent one does every epoch). An error the dataset raises in
a stream reaches the user as with the plain loader and is not a delivered batch: should a restart follow in the
same epoch, that stream resumes after its last delivered batch and meets the failing samples again.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data._utils.pin_memory import pin_memory

RESUME_METHODS = ("state_dict", "load_state_dict")


def is_resumable_stream(dataset: Any) -> bool:
    """Whether `dataset` is an IterableDataset that offers state_dict() and load_state_dict()."""
    return isinstance(dataset, IterableDataset) and all(
        callable(getattr(dataset, name, None)) for name in RESUME_METHODS
    )


def stream_count(num_workers: int) -> int:
    """How many streams a loader with `num_workers` iterates: one per worker, one in the main process."""
    return max(1, num_workers)


class StreamBatch:
    """A batch on its way from the process that loaded it to the guard's next(): the user's batch, the id of the
    stream (the worker id the user's dataset saw) that loaded it, and the dataset's state right after it."""

    __slots__ = ("batch", "state", "stream")

    def __init__(self, batch: Any, stream: int, state: Any) -> None:
        self.batch = batch
        self.stream = stream
        self.state = state

    def __reduce__(self) -> tuple[Any, ...]:
        return (StreamBatch, (self.batch, self.stream, self.state))

    def pin_memory(self) -> StreamBatch:
        """What torch's pin-memory thread calls: the user's batch is pinned, the tag passes as is."""
        return StreamBatch(pin_memory(self.batch), self.stream, self.state)


class GuardedStream(IterableDataset):
    """The user's IterableDataset as the guard's internal loader reads it: iter() loads the state its stream
    resumes from, once, then iterates the user's dataset itself.

    `rotation` and `resume` are set in the main process before each iterator starts; every worker receives them
    with its copy. Attributes set on it (a worker_init_fn setting get_worker_info().dataset.handle = ...) go to
    the user's dataset, as reading them does.
    """

    _OWN = frozenset({"inner", "rotation", "resume"})

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.rotation = 0  # stream id of the new iterator's worker 0 (see StreamWorkerInit)
        self.resume: dict[int, Any] | None = None  # stream id -> the state it continues from; used once

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def __getattr__(self, name: str) -> Any:
        if name in self._OWN:
            raise AttributeError(name)  # not set yet (unpickling)
        return getattr(self.inner, name)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        stream = 0 if info is None else info.id
        # Once: a persistent worker's later epochs, and the next iterator in the main process, start afresh.
        resume, self.resume = self.resume, None
        if resume is not None and stream in resume:
            self.inner.load_state_dict(copy.deepcopy(resume[stream]))
        return iter(self.inner)


class StreamCollate:
    """collate_fn of the guard's internal loader over an IterableDataset: the user's collate_fn, then the tag."""

    def __init__(self, collate_fn: Callable[[Any], Any], dataset: GuardedStream) -> None:
        self.collate_fn = collate_fn
        self.dataset = dataset  # the main process's: where loading runs without workers

    def __call__(self, samples: Any) -> StreamBatch:
        batch = self.collate_fn(samples)
        info = get_worker_info()
        stream = 0 if info is None else info.id
        # A copy: the state must stay what it is now while the worker's queue pickles it in its own thread.
        # The dataset is this process's (pickled with this function): get_worker_info().dataset is the user's.
        return StreamBatch(batch, stream, copy.deepcopy(self.dataset.inner.state_dict()))


class StreamWorkerInit:
    """worker_init_fn of the guard's workers over an IterableDataset: shows the user's dataset (through
    get_worker_info()) and the user's worker_init_fn the id of the stream this worker continues, torch's worker id
    rotated by GuardedStream.rotation, with that worker's seed; then runs the user's worker_init_fn with it."""

    def __init__(self, user_fn: Callable[[int], None] | None, dataset: GuardedStream) -> None:
        self.user_fn = user_fn
        self.dataset = dataset  # this worker's copy (pickled with this function)

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        stream = worker_id
        if info is not None:
            stream = (worker_id + self.dataset.rotation) % info.num_workers
            if stream != worker_id:
                _present_as(info, stream)
        if self.user_fn is not None:
            self.user_fn(stream)


def _present_as(info: Any, stream: int) -> None:
    """Make this worker look like worker `stream` of the plain loader: get_worker_info()'s id and seed, and the
    generators torch seeded at the worker's start, seeded as torch seeds that worker."""
    base_seed = info.seed - info.id
    seed = base_seed + stream
    if dataclasses.is_dataclass(info):
        shown = dataclasses.replace(info, id=stream, seed=seed)
    else:  # torch before 2.6: a plain class
        shown = type(info)(id=stream, num_workers=info.num_workers, seed=seed, dataset=info.dataset)
    torch_worker._worker_info = shown
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(torch_worker._generate_state(base_seed, stream))


class StreamRecord:
    """The main process's side: the state of the last batch delivered from each stream in this epoch, and the
    stream of the last batch delivered."""

    def __init__(self) -> None:
        self.states: dict[int, Any] = {}
        self.last: int | None = None

    def reset(self) -> None:
        """A new epoch: every stream starts from its beginning."""
        self.states = {}
        self.last = None

    def restore(self, states: dict[int, Any], last: int | None) -> None:
        self.states = dict(states)
        self.last = last

    def delivered(self, tagged: Any) -> Any:
        """The user's batch out of a StreamBatch about to be delivered, its stream's state recorded."""
        if not isinstance(tagged, StreamBatch):
            raise RuntimeError(f"loaderdoctor guard: a batch came without its stream's tag ({type(tagged).__name__})")
        self.states[tagged.stream] = tagged.state
        self.last = tagged.stream
        return tagged.batch

    def rotation(self, num_workers: int) -> int:
        """The stream the next iterator's worker 0 continues: the one after the stream delivered last."""
        return 0 if self.last is None else (self.last + 1) % stream_count(num_workers)
