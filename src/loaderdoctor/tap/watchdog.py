"""The watchdog: a thread that notices when a tapped loader has delivered no batch for too long."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from loaderdoctor.host.facts import OWN_THREAD_PREFIX
from loaderdoctor.plain.background import BackgroundThread
from loaderdoctor.tap.iterator import Tap

log = logging.getLogger("loaderdoctor")


@dataclass(frozen=True)
class StallPolicy:
    """When waiting for a batch counts as a stall.

    After the first batch: no batch for `multiple` times the slowest of the recent batches (tap.RecentWaits),
    and never sooner than floor_s. For the first batch of an epoch (start-up, which may legitimately take
    long): first_batch_s, or sooner, first_batch_idle_s, when the workers have used no CPU for idle_window_s.
    """

    floor_s: float = 10.0
    multiple: float = 20.0
    first_batch_s: float = 60.0
    first_batch_idle_s: float = 10.0
    idle_window_s: float = 4.0

    def threshold_s(self, slowest_wait_s: float, first_batch: bool) -> float:
        if first_batch:
            return self.first_batch_s
        return max(self.floor_s, self.multiple * slowest_wait_s)


@dataclass(frozen=True)
class StallNotice:
    epoch: int
    batch: int
    waited_s: float
    threshold_s: float
    reason: str
    pids: list[int]
    over_budget: bool = False


class Watchdog:
    """Checks a Tap every tick; calls on_stall once, from its own thread, when the wait passes the policy.

    `workers_idle(pids, window_s)` says whether the workers have used no CPU lately (None: unknown);
    `deadline` (a clock time) ends any wait that outlasts the caller's budget.
    """

    def __init__(
        self,
        tap: Tap,
        policy: StallPolicy,
        on_stall: Callable[[StallNotice], None],
        *,
        workers_idle: Callable[[list[int], float], bool | None] | None = None,
        deadline: float | None = None,
        tick_s: float = 0.1,
    ) -> None:
        self._tap = tap
        self._policy = policy
        self._on_stall = on_stall
        self._workers_idle = workers_idle
        self.deadline = deadline  # may be moved by the caller as its budget changes
        self.fired: StallNotice | None = None
        self._thread = BackgroundThread(OWN_THREAD_PREFIX + "watchdog", self._tick, tick_s)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (from any thread, the watchdog's own included, as its stall handler may)."""
        self._thread.stop()

    def _tick(self) -> None:
        try:
            notice = self.check(self._tap.clock())
        except Exception:  # a watchdog that dies silently would let a hang run forever
            log.exception("the watchdog's check failed; it goes on")
            return
        if notice is not None:
            self.fired = notice
            self._thread.stop()  # it fires once: from its own thread, this ends the loop after this tick
            try:
                self._on_stall(notice)
            except Exception:  # the responder ends the workers before anything that could raise
                log.exception("the stall handler failed after the stall at epoch %d", notice.epoch)

    def check(self, now: float) -> StallNotice | None:
        """The stall notice due at clock time `now`, if any."""
        current = self._tap.current
        if current is None or current.waiting_since is None:
            return None
        waited = now - current.waiting_since
        first = current.delivered == 0
        if first:
            waited = now - current.started_at  # start-up counts from iter()
        policy = self._policy
        threshold = policy.threshold_s(self._tap.slowest_wait_s, first)
        reason = None
        over_budget = False
        # Past the epoch's last batch, next() waits for torch to end the workers (each join bounded by torch):
        # a spawned worker's exit on a busy machine can take seconds. Allowed as long as a start-up.
        ending = waited > threshold and not first and self._past_last_batch(current)
        if ending:
            threshold = max(threshold, policy.first_batch_s)
        if waited > threshold:
            if first:
                reason = f"no first batch {waited:.1f} s after iter()"
            elif ending:
                reason = f"the epoch's end (its workers ended) not reached {waited:.1f} s after its last batch"
            else:
                reason = (
                    f"no batch for {waited:.1f} s, over {policy.multiple:g}x the slowest recent batch "
                    f"({self._tap.slowest_wait_s:.2f} s) and the {policy.floor_s:g} s floor"
                )
        elif (
            first
            and waited > policy.first_batch_idle_s
            and current.pids
            and self._workers_idle is not None
            and self._workers_idle(current.pids, policy.idle_window_s)
        ):
            threshold = policy.first_batch_idle_s
            reason = (
                f"no first batch {waited:.1f} s after iter(), and the workers used no CPU "
                f"in the last {policy.idle_window_s:g} s"
            )
        elif self.deadline is not None and now > self.deadline:
            threshold = waited
            reason = f"the measuring budget ran out while waiting {waited:.1f} s for this batch"
            over_budget = True
        if reason is None:
            return None
        return StallNotice(current.epoch, current.index, waited, threshold, reason, list(current.pids), over_budget)

    def _past_last_batch(self, current: object) -> bool:
        """Whether the iterator waited on has delivered (or failed) every batch of its epoch, as far as known."""
        length = self._tap.batches_per_epoch()
        return length is not None and getattr(current, "index", 0) >= length
