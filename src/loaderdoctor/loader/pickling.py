"""What a worker that does not fork receives: the pickled dataset and functions, and how many bytes they are."""

from __future__ import annotations

import pickle
from typing import Any

import torch

from loaderdoctor.errors import UsageError
from loaderdoctor.loader.settings import LoaderSpec


class _CountingSink:
    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes  # protocol 5 hands over large buffers (numpy arrays) as PickleBuffers
        self.size += size
        return size


class _SizePickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # Tensors reach spawned workers through shared memory, not inside the pickle.
        if isinstance(obj, torch.Tensor):
            return object, ()
        return NotImplemented


def worker_payload(spec: LoaderSpec) -> dict[str, Any]:
    """The objects every worker started with spawn or forkserver receives, by the names the errors use."""
    return {"dataset": spec.dataset, "collate_fn": spec.collate_fn, "worker_init_fn": spec.worker_init_fn}


def pickled_bytes(spec: LoaderSpec, start_method: str) -> int:
    """How many bytes every worker started with `start_method` receives and unpickles: the dataset and the
    functions it is loaded with. Raises a UsageError naming what cannot be pickled."""
    total = 0
    for name, value in worker_payload(spec).items():
        sink = _CountingSink()
        try:
            _SizePickler(sink, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except Exception as error:
            raise UsageError(
                f"the loader's {name} ({type(value).__name__}) cannot be pickled, and the {start_method!r} "
                f"start method must send it to every worker: {type(error).__name__}: {error}",
                hint="define classes and functions at module top level (no lambdas or local functions), "
                "and open files, connections and locks lazily inside the worker instead of in __init__",
            ) from None
        if name == "dataset":
            total += sink.size
    return total
