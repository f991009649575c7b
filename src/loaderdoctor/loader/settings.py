"""The tunable settings of a DataLoader, and a LoaderSpec that rebuilds a user's loader with any of them."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.loader.indexed import note_worker_init_failure
from loaderdoctor.loader.ownclass import OwnClass, own_class
from loaderdoctor.plain.data import dataclass_from_dict
from loaderdoctor.plain.words import plural

START_METHODS = ("fork", "forkserver", "spawn")
# process: DataLoader worker processes; thread: threads of the main process (torchdata.nodes), for work that
# releases the GIL.
BACKENDS = ("process", "thread")


@dataclass(frozen=True)
class Settings:
    """The knobs loaderdoctor measures and changes; everything else about a loader stays the user's."""

    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    start_method: str | None = None  # None: the platform's default (fork on Linux before Python 3.14)
    worker_threads: int | None = None  # None: leave each worker's thread pools as the dataset sets them
    backend: str = "process"  # see BACKENDS

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise UsageError(f"num_workers must be 0 or more, not {self.num_workers}")
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise UsageError(
                f"unknown start method {self.start_method!r}", hint=f"use one of {', '.join(START_METHODS)}"
            )
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown backend {self.backend!r}", hint=f"use one of {', '.join(BACKENDS)}")
        if self.backend == "thread" and (
            self.num_workers == 0 or self.persistent_workers or self.start_method or self.worker_threads
        ):
            raise UsageError(
                "the thread backend takes num_workers (its threads, 1 or more) and prefetch_factor only",
                hint="threads start no processes: leave persistent_workers, start_method and worker_threads unset",
            )

    @property
    def effective_start_method(self) -> str | None:
        """The start method workers really get, or None when loading runs in the main process."""
        if self.num_workers == 0 or self.backend == "thread":
            return None
        return self.start_method or default_start_method()

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes` applied, kept valid (settings that need workers are dropped without them)."""
        fields = {**dataclasses.asdict(self), **changes}
        if fields["num_workers"] == 0:
            fields.update(
                prefetch_factor=None,
                persistent_workers=False,
                start_method=None,
                worker_threads=None,
                backend="process",
            )
        return Settings(**fields)

    @property
    def batches_in_flight(self) -> int:
        """How many batches loading may hold ready ahead of the training loop: prefetch_factor per worker, or
        the threads' batches and the prefetch queue's; none without workers."""
        if self.num_workers == 0:
            return 0
        prefetch = self.prefetch_factor or 2
        if self.backend == "thread":
            return self.num_workers + prefetch
        return self.num_workers * prefetch

    def brief(self) -> str:
        """What loads, in two or three words, where a sentence names settings by their workers alone: "4 workers",
        "2 threads", "the main process"."""
        if self.num_workers == 0:
            return "the main process"
        return plural(self.num_workers, "thread" if self.backend == "thread" else "worker")

    def describe(self) -> str:
        """These settings in a few words, as every report and message names them:
        "4 workers, prefetch 2, persistent, fork", "2 threads, prefetch 2", "no workers (main process)"."""
        if self.num_workers == 0:
            words = ["no workers (main process)"]
        else:
            words = [self.brief(), f"prefetch {self.prefetch_factor or 2}"]
        if self.num_workers and self.backend == "process":
            if self.persistent_workers:
                words.append("persistent")
            words.append(self.effective_start_method or "")
            if self.worker_threads:
                words.append(plural(self.worker_threads, "thread") + " each")
        if self.pin_memory:
            words.append("pinned")
        return ", ".join(w for w in words if w)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        return dataclass_from_dict(cls, data)

    def to_kwargs(self) -> dict[str, Any]:
        """The DataLoader keyword arguments for these settings (worker_threads is applied separately)."""
        if self.num_workers == 0:
            return {"num_workers": 0, "pin_memory": self.pin_memory}
        return {
            "num_workers": self.num_workers,
            "prefetch_factor": self.prefetch_factor or 2,
            "persistent_workers": self.persistent_workers,
            "pin_memory": self.pin_memory,
            "multiprocessing_context": self.start_method,
        }

    def snippet(self, loader_class: str = "") -> str:
        """Paste-ready code that creates a DataLoader with these settings (loaderdoctor's ThreadLoader for the
        thread backend: the loader tune measured); one of `loader_class` ("module.Name": the user's own class,
        StatefulDataLoader) where it is not torch's."""
        if self.backend == "thread":
            return _thread_snippet(self)
        args = ["dataset", "batch_size=..."]
        if self.num_workers:
            args.append(f"num_workers={self.num_workers}")
            if self.persistent_workers:
                args.append("persistent_workers=True")
            if self.prefetch_factor not in (None, 2):
                args.append(f"prefetch_factor={self.prefetch_factor}")
            if self.start_method:
                args.append(f"multiprocessing_context={self.start_method!r}")
            if self.worker_threads:
                args.append("worker_init_fn=worker_init_fn")
        if self.pin_memory:
            args.append("pin_memory=True")
        name = loader_class.rpartition(".")[2][:100] or "DataLoader"
        call = f"loader = {name}(" + ", ".join(args) + ")"
        if self.num_workers and self.worker_threads:
            n = self.worker_threads
            return (
                "def worker_init_fn(worker_id):  # what loaderdoctor measured\n"
                "    import sys\n\n"
                f"    torch.set_num_threads({n})  # torch's own pool (OpenMP)\n"
                '    if "cv2" in sys.modules:  # OpenCV keeps a pool of its own in every worker\n'
                f'        sys.modules["cv2"].setNumThreads({n})\n'
                "\n" + call
            )
        return call


def _thread_snippet(settings: Settings) -> str:
    args = ["dataset", "batch_size=...", f"num_workers={settings.num_workers}"]
    if settings.prefetch_factor not in (None, 2):
        args.append(f"prefetch_factor={settings.prefetch_factor}")
    if settings.pin_memory:
        args.append("pin_memory=True")
    return (
        "from loaderdoctor import ThreadLoader  # pip install torchdata\n"
        "\n"
        "# DataLoader's arguments; its batches are loaded by threads of this process\n"
        "loader = ThreadLoader(" + ", ".join(args) + ")"
    )


def default_start_method() -> str:
    """The start method multiprocessing uses when none is set, read without fixing it as a side effect."""
    chosen = multiprocessing.get_start_method(allow_none=True)
    return chosen or multiprocessing.get_all_start_methods()[0]


@contextlib.contextmanager
def quiet_worker_count_advice() -> Iterator[None]:
    """Silences torch's warning that workers outnumber the cores (at DataLoader() and iter()): it cannot know
    whether loading computes or waits on I/O, and loaderdoctor measures that instead."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        yield


class _WorkerInit:
    """A picklable worker_init_fn: limit the worker's threads, run a hook, then the user's own function."""

    def __init__(
        self,
        user_fn: Callable[[int], None] | None,
        worker_threads: int | None,
        hook: Callable[[int], None] | None,
    ) -> None:
        self.user_fn = user_fn
        self.worker_threads = worker_threads
        self.hook = hook

    def __call__(self, worker_id: int) -> None:
        if self.hook is not None:
            self.hook(worker_id)
        if self.user_fn is not None:
            try:
                self.user_fn(worker_id)
            except Exception as error:
                note_worker_init_failure(error)
                raise
        if self.worker_threads:
            # After the user's function, since that is where thread pools are usually enlarged.
            limit_worker_pools(self.worker_threads)


def limit_worker_pools(threads: int) -> None:
    """Limit the thread pools of this worker that a call can set: torch's own (OpenMP), and OpenCV's where the
    worker has it loaded (it keeps a pool per core in every forked worker, whatever torch's is)."""
    torch.set_num_threads(threads)
    cv2 = sys.modules.get("cv2")
    set_threads = getattr(cv2, "setNumThreads", None)
    if callable(set_threads):
        set_threads(threads)


@dataclass
class LoaderSpec:
    """What a DataLoader is made of apart from its Settings: build() makes a fresh loader for any Settings."""

    dataset: Any
    batch_size: int | None
    sampler: Any
    batch_sampler: Any
    collate_fn: Callable[[Any], Any] | None
    drop_last: bool
    worker_init_fn: Callable[[int], None] | None
    generator: torch.Generator | None
    timeout: float
    settings: Settings
    own: OwnClass = dataclasses.field(default_factory=OwnClass)  # the loader's class, rebuilt as itself
    # Why the loader's class cannot be rebuilt as itself (its loaders are then torch's DataLoader), or None.
    not_own_class: str | None = None
    _said: bool = dataclasses.field(default=False, repr=False, compare=False)

    @classmethod
    def from_loader(cls, loader: DataLoader) -> LoaderSpec:
        if not isinstance(loader, DataLoader):
            kind = f"{type(loader).__module__}.{type(loader).__name__}"
            raise UsageError(f"expected a torch.utils.data.DataLoader, got {kind}")
        context = loader.multiprocessing_context
        start_method = context if isinstance(context, str) or context is None else context.get_start_method()
        settings = Settings(
            num_workers=loader.num_workers,
            prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
            persistent_workers=bool(loader.persistent_workers),
            pin_memory=bool(loader.pin_memory),
            start_method=start_method if loader.num_workers else None,
        )
        own, not_own = own_class(loader)
        return cls(
            own=own,
            not_own_class=not_own,
            dataset=loader.dataset,
            batch_size=loader.batch_size,
            sampler=loader.sampler,
            batch_sampler=loader.batch_sampler,
            collate_fn=loader.collate_fn,
            drop_last=loader.drop_last,
            worker_init_fn=loader.worker_init_fn,
            generator=loader.generator,
            timeout=loader.timeout,
            settings=settings,
        )

    @property
    def is_iterable(self) -> bool:
        return isinstance(self.dataset, IterableDataset)

    def build(
        self,
        settings: Settings,
        *,
        dataset: Any = None,
        worker_hook: Callable[[int], None] | None = None,
    ) -> DataLoader:
        """A new DataLoader with `settings`; `dataset` replaces the dataset (a wrapper), `worker_hook` runs
        first in every worker. The thread backend gives a ThreadLoader instead, iterated the same way."""
        if settings.backend == "thread":
            return self._build_threads(settings, self.dataset if dataset is None else dataset)
        kwargs: dict[str, Any] = settings.to_kwargs()
        if settings.num_workers:
            kwargs["worker_init_fn"] = (
                _WorkerInit(self.worker_init_fn, settings.worker_threads, worker_hook)
                if (worker_hook or settings.worker_threads)
                else self.worker_init_fn
            )
            kwargs["timeout"] = self.timeout
        if self.is_iterable:
            kwargs.update(batch_size=self.batch_size, drop_last=self.drop_last)
        elif self.batch_sampler is not None:
            kwargs["batch_sampler"] = self.batch_sampler
        else:
            kwargs.update(batch_size=self.batch_size, sampler=self.sampler, drop_last=self.drop_last)
        if self.not_own_class is not None and not self._said:
            self._said = True
            warnings.warn(f"{self.not_own_class}: its loaders are rebuilt as torch's DataLoader with the same "
                          "dataset, sampler and collate_fn", LoaderDoctorWarning, stacklevel=2)  # fmt: skip
        with quiet_worker_count_advice():
            return self.own.make(  # the user's own class (StatefulDataLoader), else torch's DataLoader
                self.dataset if dataset is None else dataset,
                collate_fn=self.collate_fn,
                generator=self.generator,
                **kwargs,
            )

    def _build_threads(self, settings: Settings, dataset: Any) -> Any:
        from loaderdoctor.loader.threads import ThreadLoader  # it refuses an IterableDataset, saying what to use

        batching: dict[str, Any] = (
            {"batch_sampler": self.batch_sampler}
            if self.batch_sampler is not None
            else {"sampler": self.sampler, "batch_size": self.batch_size, "drop_last": self.drop_last}
        )
        return ThreadLoader(
            dataset,
            **batching,
            num_workers=settings.num_workers,
            collate_fn=self.collate_fn,
            pin_memory=settings.pin_memory,
            prefetch_factor=settings.prefetch_factor or 2,
            generator=self.generator,
        )
