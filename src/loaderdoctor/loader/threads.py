"""ThreadLoader: a DataLoader whose batches threads of the main process load (torchdata.nodes), for a map-style
dataset whose work releases the GIL: what tune measures for the thread backend, and what its report hands on."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    default_collate,
    default_convert,
)

from loaderdoctor.errors import UsageError

# How long the reaper waits for a stopped epoch's threads (one stuck in a sample is left to end alone).
_REAP_WAIT_S = 5.0
INSTALL_HINT = "pip install torchdata (0.11 or later), or install loaderdoctor with its [threads] extra"


def threads_available() -> bool:
    """Whether the thread backend can run here (torchdata.nodes is installed)."""
    try:
        import torchdata.nodes  # noqa: F401
    except ImportError:
        return False
    return True


class _LoadBatch:
    """Loads and collates one batch (or one sample, when the loader does not batch) in a thread."""

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any], batched: bool) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batched = batched

    def __call__(self, indices: Any) -> Any:
        if self.batched:
            return self.collate_fn([self.dataset[i] for i in indices])
        return self.collate_fn(self.dataset[indices])


class _ThreadIterator:
    """One epoch of a ThreadLoader; _shutdown_workers() stops its threads (the name the tap ends workers by)."""

    def __init__(self, loader: Any) -> None:
        self._loader: Any = loader
        self._inner: Any = iter(loader)
        self._reaper: threading.Thread | None = None

    def __iter__(self) -> _ThreadIterator:
        return self

    def __next__(self) -> Any:
        if self._inner is None:
            raise StopIteration  # its threads were stopped
        return next(self._inner)

    def __del__(self) -> None:
        # A loop that leaves an epoch early (`break`) drops its iterator: stop the threads and free what they
        # loaded ahead now, not at the next full garbage collection.
        self._shutdown_workers()

    def _shutdown_workers(self) -> None:
        # torchdata stops its threads when its iterators are collected, joining each (0.1 s for a thread that
        # waits on a queue, paid at every epoch's end): tell them to stop instead, and let a thread of ours
        # wait for them. Its loader and iterator refer to each other, and a thread ending on its stop leaves
        # its last item in a cycle through the StopIteration it queues: the batches loaded ahead would stay
        # in memory until a full garbage collection (memory-heavy's epochs cut short left 1 GB each, until a
        # tuner's process held 8 GB and loaded 3x slower). So the cycle is broken, and the queues emptied now
        # and again once the threads have ended.
        loader = getattr(self, "_loader", None)  # None too when iter() raised in __init__
        self._loader = self._inner = None
        if loader is None:
            return
        iterators = []
        node = getattr(loader, "root", None)
        while node is not None:
            for owner in (node, getattr(node, "_it", None)):
                iterator = getattr(owner, "_it", None)
                if iterator is not None and hasattr(iterator, "__dict__"):
                    iterators.append(iterator)
                    _stop(iterator)
            node = getattr(node, "source", None)
        loader._it = None
        # Not a daemon: the interpreter waits for it, and so for the threads it waits for, before it exits (a
        # thread still in torch's code as the process ends aborts it: "terminate called without an active
        # exception").
        reaper = threading.Thread(target=_reap, args=(iterators,), name="loaderdoctor-thread-reaper")
        with contextlib.suppress(RuntimeError):  # the interpreter is shutting down: its threads end with it
            reaper.start()
            self._reaper = reaper

    def wait_stopped(self) -> None:
        """After _shutdown_workers(): wait until the stopped threads have ended (REAP_WAIT_S at most). Threads
        stopped in the middle of an epoch finish the batch each was loading; a loop of whole epochs never
        overlaps that work with its next epoch's start, so a measurement that cuts epochs short waits here."""
        if self._reaper is not None:
            self._reaper.join()


def _stop(iterator: Any) -> None:
    """Set the stop events of one of torchdata's iterators and drop what its queues hold."""
    for value in list(vars(iterator).values()):
        if isinstance(value, queue.Queue):
            with value.mutex:
                value.queue.clear()
        elif callable(getattr(value, "is_set", None)) and callable(getattr(value, "set", None)):
            value.set()  # threading's and multiprocessing's Events


def _reap(iterators: list[Any]) -> None:
    """Wait for the stopped iterators' threads to end (REAP_WAIT_S at most: one stuck in a sample is left to
    end with the process), then drop what they queued as they ended."""
    deadline = time.monotonic() + _REAP_WAIT_S
    for iterator in iterators:
        for value in list(vars(iterator).values()):
            for thread in value if isinstance(value, list) else [value]:
                if isinstance(thread, threading.Thread) and thread is not threading.current_thread():
                    thread.join(timeout=max(0.0, deadline - time.monotonic()))
    for iterator in iterators:
        _stop(iterator)


class ThreadLoader:
    """A DataLoader whose batches `num_workers` threads of this process load (torchdata.nodes), at most
    `prefetch_factor` batches ahead, in the sampler's order: for a map-style dataset whose loading releases the
    GIL. It takes DataLoader's arguments for what it does, raises as DataLoader does on the same mistakes, and
    draws from the random generators as DataLoader does, so a seeded shuffle gives DataLoader's order. Threads
    start afresh each epoch (they cost next to nothing to start) and share the process's random state."""

    persistent_workers = False

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 2,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        prefetch_factor: int = 2,
        generator: torch.Generator | None = None,
    ) -> None:
        if not threads_available():
            raise UsageError("the thread backend needs torchdata, which is not installed", hint=INSTALL_HINT)
        if isinstance(dataset, IterableDataset):
            raise UsageError(
                "the thread backend loads map-style datasets only (it hands indices to its threads)",
                hint="use worker processes (backend='process', torch's DataLoader with num_workers) for an "
                "IterableDataset",
            )
        if num_workers < 1 or prefetch_factor < 1:
            raise ValueError(
                f"ThreadLoader needs num_workers and prefetch_factor of 1 or more, not {num_workers} and "
                f"{prefetch_factor} (torch's DataLoader loads in the main process with num_workers=0)"
            )
        # DataLoader's checks, in its words.
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
                )
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.generator = generator
        batched = batch_sampler is not None
        self.collate_fn = collate_fn or (default_collate if batched else default_convert)
        self._load = _LoadBatch(dataset, self.collate_fn, batched)

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __iter__(self) -> Iterator[Any]:
        import torchdata.nodes as tn

        # DataLoader draws its workers' base seed from the generator at every iter(), before the sampler draws
        # its own: drawn here too, the sampler sees the same random state and gives the same order.
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        node = tn.IterableWrapper(self._index_sampler)  # not SamplerWrapper: it sets a sampler's epoch itself
        node = tn.ParallelMapper(node, map_fn=self._load, num_workers=self.num_workers, method="thread")
        node = tn.Prefetcher(node, prefetch_factor=self.prefetch_factor)
        if self.pin_memory and torch.cuda.is_available():
            node = tn.PinMemory(node)
        return _ThreadIterator(tn.Loader(node))
