"""GuardedLoader's answers to a failure: what kind it is, a stall's stacks and the end of what is stuck, a
worker's death, the restart one rung down, and the error when no restart or rung is left. A base class of
GuardedLoader, split off by responsibility: it reads and sets the loader's own state, declared below."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loaderdoctor.errors import LoaderGaveUp
from loaderdoctor.guard import children
from loaderdoctor.guard.events import GuardEvent
from loaderdoctor.guard.inner import HeldAtDeath, Inner, Resources
from loaderdoctor.guard.recovery import (
    ASK_WORKERS,
    DIED,
    FailureFacts,
    Rung,
    choose_rung,
    classify,
    death_cause,
)
from loaderdoctor.guard.texts import death_event, gave_up_error, restart_event, stall_event
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.recording.record import WorkerStack
from loaderdoctor.tap.iterator import DEATH_GRACE_S
from loaderdoctor.tap.signals import raise_if_stopping
from loaderdoctor.tap.stalls import Ended, respond_to_stall
from loaderdoctor.tap.watchdog import StallNotice, StallPolicy, Watchdog

if TYPE_CHECKING:
    import threading

    from loaderdoctor.guard.resume import Resume
    from loaderdoctor.guard.safe import StartSafety
    from loaderdoctor.tap.interrupt import MainThreadInterrupter

log = logging.getLogger("loaderdoctor")


class FailureHandling:
    """The failure half of GuardedLoader (see the module's docstring)."""

    # The loader's state this half reads and sets (GuardedLoader.__init__ sets them).
    settings: Settings
    policy: StallPolicy
    tried: list[Settings]
    restarts: int
    max_restarts: int
    _spec: LoaderSpec
    _resume: Resume
    _safety: StartSafety
    _resources: Resources
    _epoch: int
    _position: int
    _escalated: bool
    _retried_as_was: bool  # a death had its workers started again with the same settings (once only)
    _active: bool
    _consumer: threading.Thread
    _main_interrupter: MainThreadInterrupter | None
    _last_stacks: list[WorkerStack]
    _last_loading: list[tuple[int, Any]] | None  # the batches the worker that died last had in hand
    _last_killer: int | None  # the dataset index it was loading, when known

    @property
    def _inner(self) -> Inner | None:
        return self._resources.inner

    def _record(self, event: GuardEvent) -> None:
        raise NotImplementedError

    def _close_inner(self) -> None:
        raise NotImplementedError

    def _facts(self, inner: Inner) -> FailureFacts:
        return FailureFacts(
            num_workers=inner.settings.num_workers,
            stalled=inner.stalled,
            died=inner.died,
            users_timeout_s=float(self._spec.timeout),
            exited=inner.dead_workers(0.0),
            waited_s=inner.iterator.failed_wait_s if inner.iterator is not None else 0.0,
        )

    def _failure(self, inner: Inner | None, error: BaseException) -> str | None:
        """What the guard recovers from in `error`: STALL, DIED; or USERS_TIMEOUT or None, the user's to see: see
        recovery.py."""
        if inner is None:
            return None
        kind = classify(error, self._facts(inner))
        if kind == ASK_WORKERS:
            kind = DIED if inner.dead_workers(DEATH_GRACE_S) else None
        if kind == DIED and inner.died is None and not isinstance(error, RuntimeError):
            # Not torch's report of the death but what it caused (a broken pipe, an EOFError): name the workers.
            dead = ", ".join(map(str, inner.dead_workers(0.0)))
            inner.died = f"DataLoader worker (pid(s) {dead}) exited: {type(error).__name__}: {error}"
        return kind

    def _watch(self, inner: Inner) -> None:
        """Start the watchdog over `inner`'s batches (again, after a main-process stall that ended by itself)."""
        inner.watchdog = Watchdog(inner.tap, self.policy, _on_stall_of(self, inner)).start()

    def _stall(self, inner: Inner, notice: StallNotice) -> None:
        """From the watchdog's thread: take the stuck workers' stacks, record the stall, end the workers (or
        interrupt the main thread's next()): see stalls.py."""
        interrupter = None if notice.pids else self._main_interrupter
        ended = respond_to_stall(
            notice,
            dump_dir=self._resources.stack_dir(),
            consumer=self._consumer,
            interrupter=interrupter,
            record=lambda stacks: self._record_stall(inner, notice, stacks, interrupted=interrupter is not None),
        )
        if ended is Ended.KILLED:
            # The blocked next() ends at once: by torch's SIGCHLD handler for forked workers, by this one for
            # the others (torch would notice only at its next 5 s check).
            children.interrupt(inner)
        elif interrupter is not None and ended is not Ended.INTERRUPTED:
            log.error("loaderdoctor guard: %s", interrupter.why_not())

    def _record_stall(self, inner: Inner, notice: StallNotice, stacks: list[WorkerStack], *, interrupted: bool) -> None:
        self._last_stacks = stacks
        self._record(stall_event(notice, inner.start + notice.batch, inner.settings, stacks, interrupted=interrupted))

    def _recover(self, kind: str, error: BaseException | None) -> None:
        """End the failed iterator and step one rung down the ladder (after a main-process stall: up to a worker),
        or raise when no restart or rung is left: see recovery.choose_rung. A job being stopped (SIGTERM under `run`)
        is not started again: its stop is raised instead (its workers were stopped with it)."""
        raise_if_stopping()
        inner = self._inner
        failed = inner.settings if inner is not None else self.settings
        skipped = None
        if kind == DIED:
            cause = death_cause(error, None if inner is None else inner.died)
            dead = [] if inner is None else inner.dead_workers(0.0)
            held = HeldAtDeath([], None, False) if inner is None else inner.held_at_death(dead)
            positions = [inner.start + task for task in held.tasks] if inner is not None else []
            self._last_loading = [(p, self._resume.indices(p)) for p in positions] or None
            self._last_killer = held.index
            self._record(death_event(self._epoch, self._position, cause, dead, self._last_loading, held.index))
            # Skipped only when the sample crashed its worker: a SIGKILL (the OOM killer) may fall on any sample.
            if held.crashed and self._resume.skip_killer(held.index, cause):
                skipped = held.index
        self._close_inner()
        rung = choose_rung(
            failed,
            kind,
            restarts_left=self.restarts < self.max_restarts,
            escalated=self._escalated,
            tried=self.tried,
            picklable=self._safety.picklable,
            per_worker_streams=self._resume.per_worker_streams,
            killer_skipped=skipped,
            retried_as_was=self._retried_as_was,
        )
        if rung is None:
            self._active = False
            self._resources.release()  # no worker and no stack-dump folder left behind
            raise self._gave_up(kind, error) from error
        self._retried_as_was = self._retried_as_was or (kind == DIED and skipped is None and rung.settings == failed)
        escalated = failed.num_workers == 0 and rung.settings.num_workers > 0
        self._escalated = self._escalated or escalated
        self.restarts += 1
        self.settings = rung.settings
        self._record_restart(kind, failed, rung, escalated)

    def _record_restart(self, kind: str, failed: Settings, rung: Rung, escalated: bool) -> None:
        words, more = self._resume.restart_words(rung.settings)
        message, detail = restart_event(
            kind,
            self._epoch,
            self._position,
            self._at() + words,
            self.restarts,
            self.max_restarts,
            (failed, rung.settings),
        )
        detail.update(escalated=escalated, **more)
        self._record(GuardEvent("restart", self._epoch, self._position, message + rung.why, detail))

    def _at(self) -> str:
        """The epoch's next batch, as the guard's messages name it: of how many, when a plan says."""
        length = self._resume.length()
        return f"batch {self._position}" + ("" if length is None else f" of {length}")

    def _gave_up(self, kind: str, error: BaseException | None) -> LoaderGaveUp:
        if self._escalated:
            why_no_rung = " Loading had moved out of the main process to one spawned worker already: the last rung."
        else:
            why_no_rung = self._resume.gave_up_words(self.settings)
        where = f"epoch {self._epoch}, {self._at()}"
        tried = self.tried or [self.settings]
        stacks, loading = self._last_stacks, self._last_loading if kind == DIED else None
        killer = self._last_killer if kind == DIED else None
        return gave_up_error(
            kind, where, tried, self.restarts, self.max_restarts, why_no_rung, stacks, error, loading, killer
        )


def _on_stall_of(guarded: FailureHandling, inner: Inner) -> Callable[[StallNotice], None]:
    # The watchdog's thread holds this callback: a weak reference lets an abandoned loader be collected.
    ref = weakref.ref(guarded)

    def on_stall(notice: StallNotice) -> None:
        loader = ref()
        if loader is not None:
            loader._stall(inner, notice)

    return on_stall
