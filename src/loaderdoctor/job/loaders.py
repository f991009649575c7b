"""Every DataLoader a script makes, watched without a change to the script: while installed, torch's
DataLoader.__init__ notes where the user's code made each loader, and DataLoader.__iter__ runs each of them
through a watch (guarded too, when asked), named by that place ("train.py:41", or the framework's method that
made it for the user's line: "Trainer.get_train_dataloader (train.py:42)"; see job/sites.py). Loaders made at
one place are told apart by the order of their first iter() ("train.py:41#2"): no two watches share a name.

Accelerate's DataLoaderDispatcher on several processes (an IterableDataset's loader) iterates its DataLoader on the
main process alone and hands every process its slice of each batch: there the loop's batches are the
dispatcher's, so its iter() is hooked too (once accelerate is imported), and its DataLoader is watched on every
process through the dispatcher's epochs; the DataLoader's own iter() inside them is the watch's, opened first so
that its workers start at the epoch's iter() as a DataLoader's do.

The hooks sit on torch's class itself, not on the name torch.utils.data.DataLoader: loaders made by libraries
that bound the class at import (Lightning re-making a loader for its DistributedSampler), subclasses, and code
that checks type() or isinstance() all see torch's class as it is. Loaders that loaderdoctor makes for itself
(the guard's own) are left alone. The hooks are installed only while a script runs, and restored after it
(unless somebody replaced them since, then they are left as they are and pass everything through).
"""

from __future__ import annotations

import collections
import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data.dataloader import DataLoader as TorchDataLoader

from loaderdoctor.errors import UsageError
from loaderdoctor.guard import GuardedLoader, guard
from loaderdoctor.job.ownclasses import SubclassHooks
from loaderdoctor.job.places import announce, this_place
from loaderdoctor.job.sites import creation_site
from loaderdoctor.plain.usercode import is_own_file
from loaderdoctor.report import LoaderReport
from loaderdoctor.tap.iterator import shutdown
from loaderdoctor.watch.rankceilings import JobStore, job_store
from loaderdoctor.watch.watched import WatchedLoader

log = logging.getLogger("loaderdoctor")

# Loaders watched at most per place in the code: a script that makes a loader afresh every epoch gets the first
# ones watched, the rest iterate as they would unwatched (each watched loader is kept until the script ends).
MAX_PER_SITE = 8


@functools.lru_cache(maxsize=1024)
def _is_own(filename: str) -> bool:
    return is_own_file(filename)


class EveryLoader:
    """The hooks on torch's DataLoader while a script runs, and the watches they made (see the module's text).
    `name` goes before each loader's name, and `rank` (a distributed run's) after it ("train.py:41/rank1");
    `guarded` guards every loader; `ceiling` puts every one through data-free turns (see watch())."""

    def __init__(
        self,
        *,
        name: str | None = None,
        rank: int | None = None,
        guarded: bool = False,
        ceiling: bool | int = False,
        ceiling_only: bool = False,
    ) -> None:
        self.name = name
        self.rank = rank
        self.guarded = guarded
        self.ceiling = ceiling
        self.ceiling_only = ceiling_only
        self.watches: list[WatchedLoader] = []
        self._sites: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._watched: dict[Any, WatchedLoader] = {}  # loader -> its watch (which keeps the loader until close())
        self._per_site: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._original_init: Callable[..., None] | None = None
        self._original_iter: Callable[[Any], Iterator[Any]] | None = None
        self._init_hook: Callable[..., None] | None = None
        self._iter_hook: Callable[[Any], Iterator[Any]] | None = None
        self._dispatch_hook: tuple[type, Callable[[Any], Iterator[Any]], Callable[[Any], Iterator[Any]]] | None = None
        self._opened: dict[Any, Iterator[Any]] = {}  # a dispatcher's DataLoader -> torch's iterator opened for it
        self._subclass_hooks = SubclassHooks()  # those that make or iterate themselves (StatefulDataLoader)
        self.active = False
        # The job's store and this process's place in it, as the first watched loader was iterated (None outside a
        # distributed run): where the ranks of a job meet at its end (endmeeting.py).
        self.job: JobStore | None = None
        # The job folder of the `loaderdoctor run` that joins these loaders, when one does (job/places.py).
        self.joined_by: str | None = None

    def install(self) -> None:
        """Hook torch's DataLoader: from now on every loader made is watched when iterated."""
        if self.active:
            return
        original_init = self._original_init = TorchDataLoader.__init__
        original_iter = self._original_iter = TorchDataLoader.__iter__

        __init__ = self._init_hook_of(original_init)
        __iter__ = self._iter_hook_of(original_iter)
        __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
        __iter__.__wrapped__ = original_iter  # type: ignore[attr-defined]
        self._init_hook, self._iter_hook = __init__, __iter__
        TorchDataLoader.__init__ = __init__  # type: ignore[method-assign]
        TorchDataLoader.__iter__ = __iter__  # type: ignore[method-assign]
        self._subclass_hooks.install(init_hook_of=self._init_hook_of, iter_hook_of=self._iter_hook_of)
        self.active = True
        if "accelerate.data_loader" in sys.modules:
            self._hook_dispatcher()

    def _init_hook_of(self, original_init: Callable[..., None]) -> Callable[..., None]:
        """An `__init__` that notes where the user's code made the loader, standing in for `original_init` (torch's,
        or a subclass's own: ownclasses.py)."""
        every = self

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            original_init(loader, *args, **kwargs)
            if every.active:
                every._note_site(loader, sys._getframe(1))
                if every._dispatch_hook is None and "accelerate.data_loader" in sys.modules:
                    every._hook_dispatcher()

        return __init__

    def _iter_hook_of(self, original_iter: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
        """An `__iter__` that watches the loader it iterates, standing in for `original_iter` (torch's, or a
        subclass's own: ownclasses.py)."""
        every = self

        def __iter__(loader: Any) -> Iterator[Any]:
            if every._opened and (opened := _pop(every._opened, loader)) is not None:
                return opened  # a dispatcher's iter() of its DataLoader, inside the watched dispatcher's epoch
            if not every.active or _is_own(sys._getframe(1).f_code.co_filename):
                return original_iter(loader)  # loaderdoctor's own iteration: a watch or guard the script made
            if every._subclass_hooks.outermost_iter(loader, every._original_iter) is not original_iter:
                return original_iter(loader)  # inside the loader's own __iter__, which its watch opened
            try:
                watched = every._watch_of(loader)
            except Exception as error:  # an unhashable subclass, say: iterated as it would be unwatched
                log.debug("loaderdoctor run: a DataLoader is not watched: %s", error)
                watched = None
            return original_iter(loader) if watched is None else iter(watched)

        return __iter__

    def _hook_dispatcher(self) -> None:
        """Hook accelerate's DataLoaderDispatcher.__iter__ (see the module): on several processes, its DataLoader
        is watched through the dispatcher's epochs; on one, the DataLoader's own iter() is (as any loader's)."""
        dispatcher = getattr(sys.modules.get("accelerate.data_loader"), "DataLoaderDispatcher", None)
        if dispatcher is None or "__iter__" not in dispatcher.__dict__:
            return
        original = dispatcher.__iter__
        every = self

        def __iter__(wrapper: Any) -> Iterator[Any]:
            try:
                several = every.active and int(wrapper.state.num_processes) > 1
                loader = wrapper.base_dataloader
                watched = every._watch_of(loader, dispatcher=(wrapper, original)) if several else None
            except Exception as error:  # iterated as it would be unwatched
                log.debug("loaderdoctor run: accelerate's dispatcher is not watched: %s", error)
                watched = None
            return original(wrapper) if watched is None else iter(watched)

        __iter__.__wrapped__ = original  # type: ignore[attr-defined]
        self._dispatch_hook = (dispatcher, original, __iter__)
        dispatcher.__iter__ = __iter__  # type: ignore[method-assign]

    def _dispatched_epoch(self, wrapper: Any, original: Callable[[Any], Iterator[Any]]) -> DispatchedEpoch:
        """An epoch of accelerate's dispatcher `wrapper`, its DataLoader's iterator opened first (workers start now)
        and handed to the dispatcher when it asks."""
        loader = wrapper.base_dataloader
        assert self._original_iter is not None
        torch_iterator = self._subclass_hooks.outermost_iter(loader, self._original_iter)(loader)
        self._opened[loader] = torch_iterator
        return DispatchedEpoch(original(wrapper), torch_iterator)

    def uninstall(self) -> None:
        """Put torch's methods back (unless another hook replaced ours since: then ours pass everything on)."""
        if not self.active:
            return
        self.active = False
        if TorchDataLoader.__dict__.get("__init__") is self._init_hook:
            TorchDataLoader.__init__ = self._original_init  # type: ignore[method-assign,assignment]
        if TorchDataLoader.__dict__.get("__iter__") is self._iter_hook:
            TorchDataLoader.__iter__ = self._original_iter  # type: ignore[method-assign,assignment]
        self._subclass_hooks.uninstall()
        if self._dispatch_hook is not None:
            dispatcher, original, hook = self._dispatch_hook
            if dispatcher.__dict__.get("__iter__") is hook:
                dispatcher.__iter__ = original  # type: ignore[attr-defined]
            self._dispatch_hook = None
        self._opened = {}

    def _note_site(self, loader: Any, frame: Any) -> None:
        try:
            if loader in self._sites:
                return
            site = creation_site(frame, loader, self._sites.get)
            if site is not None:
                self._sites[loader] = site
        except Exception as error:  # never fail the user's DataLoader(...)
            log.debug("loaderdoctor run: no site for a DataLoader: %s", error)

    def _watch_of(self, loader: Any, dispatcher: tuple[Any, Any] | None = None) -> WatchedLoader | None:
        """The watch of `loader`, made at its first iter(); None for loaders left alone. With `dispatcher`
        (accelerate's, and its original __iter__), its epochs are the dispatcher's."""
        watched = self._watched.get(loader)
        if watched is not None:
            return watched
        site = self._sites.get(loader)
        if site is None:
            return None
        with self._lock:
            self._per_site[site] += 1
            count = self._per_site[site]
            if count > MAX_PER_SITE:
                if count == MAX_PER_SITE + 1:
                    log.warning("loaderdoctor run: more than %d DataLoaders made at %s: the later ones are not "
                                "watched", MAX_PER_SITE, site)  # fmt: skip
                del self._sites[loader]
                return None
            name = site if count == 1 else f"{site}#{count}"
            if self.name:
                name = f"{self.name}/{name}"
            if self.rank is not None:
                name += f"/rank{self.rank}"
            try:
                watched = self._make_watch(loader, name, dispatcher)
            except Exception as error:  # loaderdoctor's failure leaves the loader as it was, said once
                log.warning("loaderdoctor run: %s is not watched: %s: %s", name, type(error).__name__, error)
                del self._sites[loader]
                return None
            self._watched[loader] = watched
            self.watches.append(watched)
            watched.when_an_epoch_ends(self.epoch_ended)
            if self.job is None:
                self.job = _job_now()
                if self.job is not None and self.joined_by is not None:
                    announce(self.job, this_place(self.joined_by))  # for rank 0, at the job's end
            return watched

    def _make_watch(self, loader: Any, name: str, dispatcher: tuple[Any, Any] | None) -> WatchedLoader:
        """The watch of `loader` (the history is kept by the command, with what the ranks add)."""
        assert self._original_iter is not None
        original_iter: Callable[[Any], Any] = self._subclass_hooks.outermost_iter(loader, self._original_iter)
        if dispatcher is not None:
            wrapper, original = dispatcher
            original_iter = lambda _loader: self._dispatched_epoch(wrapper, original)  # noqa: E731
            if self.guarded:
                log.warning("loaderdoctor run: %s is watched, not guarded: accelerate dispatches its batches", name)
        elif self.guarded:
            try:
                guarded = guard(loader, persistent_workers=loader.persistent_workers)
            except UsageError as error:  # a stream the guard cannot resume: watched as it is, said so
                log.warning("loaderdoctor run: %s is watched, not guarded: %s", name, error.message)
            else:
                loader = guarded
        return WatchedLoader(
            loader,
            name,
            history=False,
            open_iterator=original_iter,
            log_diagnosis=False,
            ceiling=self.ceiling,
            ceiling_only=self.ceiling_only,
            meet_ranks=False,  # the command has the job's ceiling from what each process wrote
        )

    def epoch_ended(self) -> None:
        """Told after any watched loader's epoch ends, in the loop's thread (a rank sends what it measured so far)."""

    def runs_so_far(self) -> list[LoaderRun]:
        """The runs of the loaders that delivered batches so far, every watch going on."""
        runs = []
        for watched in list(self.watches):
            report = watched.report_so_far()
            if report is not None:
                runs.append(LoaderRun(report, watched.started_at, watched.snapshot.to_dict()))
        return runs

    def close(self) -> list[LoaderRun]:
        """End every watch: the runs of the loaders that delivered batches, in the order they were first
        iterated. Also uninstalls the hooks, and lets the loaders go."""
        self.uninstall()
        runs = []
        for watched in self.watches:
            report = watched.close()
            if report is not None:
                runs.append(LoaderRun(report, watched.started_at, watched.snapshot.to_dict()))
            _end_workers(watched.loader)
        # The loaders go when the script drops them (and their persistent workers with them), as unwatched.
        self.watches, self._watched = [], {}
        self._sites = weakref.WeakKeyDictionary()
        return runs


class DispatchedEpoch:
    """An epoch of accelerate's dispatcher as a watch takes it: the dispatcher's batches, and the attributes of
    torch's iterator of the DataLoader under it (its workers: started, shut down, found dead)."""

    def __init__(self, batches: Iterator[Any], torch_iterator: Iterator[Any]) -> None:
        self.batches = batches
        self.torch_iterator = torch_iterator

    def __iter__(self) -> DispatchedEpoch:
        return self

    def __next__(self) -> Any:
        return next(self.batches)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("batches", "torch_iterator"):
            raise AttributeError(name)
        return getattr(self.torch_iterator, name)


def _job_now() -> JobStore | None:
    try:
        return job_store()
    except Exception as error:  # a process group being torn down: no job to meet
        log.debug("loaderdoctor run: no job store: %s", error)
        return None


def _pop(opened: dict[Any, Iterator[Any]], loader: Any) -> Iterator[Any] | None:
    try:
        return opened.pop(loader, None)
    except TypeError:  # an unhashable loader: none was opened for it
        return None


@dataclass
class LoaderRun:
    """One watched loader's diagnosis, with what its history record needs: when it began, the host then."""

    report: LoaderReport
    started_at: str
    host: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.report.name, "report": self.report.to_dict(), "started_at": self.started_at,
                "host": self.host}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderRun:
        return cls(LoaderReport.from_dict(data["name"], data["report"]), data["started_at"], data["host"])


def _end_workers(loader: Any) -> None:
    """End a loader's workers now that the script is done with it, persistent ones included: left to the garbage
    collector (the watch and its loader hold each other), torch would wait 5 s for each worker to end."""
    try:
        if isinstance(loader, GuardedLoader):
            loader.close()
        else:
            shutdown(loader, getattr(loader, "_iterator", None))
    except Exception as error:  # the script is over: its workers end with this process anyway
        log.debug("loaderdoctor run: ending a loader's workers failed: %s", error)
