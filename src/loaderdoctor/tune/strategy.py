"""The search strategy: a noise-aware climb over worker counts, a few refinements, and a final of successive
halving, all through one measure function and within a time budget.

1. Baseline: the user's settings.
2. Workers: 0, 1, 2, 4, ... while each doubling is GAIN faster than the best so far (one worker is never the
   end: it does the main process's work elsewhere and shows no parallelism yet). The climb goes past the
   cores only while the workers wait (I/O) rather than compute, and stops early once the loader keeps up
   with the training step or runs near the host's limit. A climb ended by such an estimate takes one more
   trial outside quick mode: the next count with a deeper prefetch. Workers kept off the cores while ready to
   run (by other processes) count as computing: more of them would only take CPU from those processes.
3. Refine (full mode): threads; the counts between the best and its tried neighbours; a larger prefetch.
4. Final: the fastest few are measured again, the slower half dropped, the rest measured once more.
   Rates within EQUAL of the fastest, or within the spread of its own runs where load came and went (up to
   CLOSE), count as equal and the cheapest of them is chosen; with a training step, the cheapest that keeps up
   with it.

A close call (rates within CLOSE of each other) is measured again before it decides anything, and compared
by medians. Nothing is run that is predicted to break the memory budget or fill /dev/shm, and nothing is
started that the time left cannot pay for. A trial that stalls or crashes is recorded and never chosen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from loaderdoctor.loader.settings import Settings
from loaderdoctor.plain.words import plural
from loaderdoctor.recording.limit import reaches_limit
from loaderdoctor.tune.budgets import mb, refused
from loaderdoctor.tune.space import PREFETCH_FACTORS, Limits, candidate, worker_counts
from loaderdoctor.tune.trial import Measurement, Trial

log = logging.getLogger("loaderdoctor")

Measure = Callable[[Settings, float], Measurement]  # (settings, seconds to measure for) -> what was measured

GAIN = 1.05  # a step up the climb must be this much faster than the best so far
CLOSE = 0.10  # rates within 10% of each other are a close call: measured again before deciding
EQUAL = 0.03  # in the final, rates within 3% of the fastest are equal: the cheapest of them wins
FINALISTS = 4  # trials measured again in the final (2 in quick mode)
COMPUTING = 0.85  # workers using this share of the cores already: more than the cores only compete
NEAR_LIMIT = 0.95  # a trial at this share of the host's limit (limit.py) or more: no setting can do much better
PAST_PREFETCH = 4  # the prefetch of the one trial that checks a climb ended on an estimate


@dataclass
class SearchResult:
    trials: list[Trial]
    baseline: Trial
    chosen: Trial
    seconds: float
    stopped: str  # "converged" | "budget" | "interrupted": whether time or Ctrl-C ended the search before it was done


def _near_limit(trial: Trial) -> bool:
    """Whether a trial runs within a few percent of the host's limit as its own runs measured it."""
    limit = trial.limit_batches_per_s
    return limit is not None and trial.batches_per_s >= NEAR_LIMIT * limit


def _noise(trial: Trial) -> float:
    """The share of its rate within which another trial counts as fast as `trial`: EQUAL, or as far apart as its
    own runs were (load that comes and goes), up to CLOSE."""
    rates = [run.batches_per_s for run in trial.runs]
    if len(rates) < 2 or trial.batches_per_s <= 0:
        return EQUAL
    return min(CLOSE, max(EQUAL, (max(rates) - min(rates)) / trial.batches_per_s))


def cost(trial: Trial) -> tuple[int, int, int, int]:
    """What a trial's settings cost the host, to order equals: processes started, memory, threads, prefetch."""
    settings = trial.settings
    processes = settings.num_workers if settings.backend == "process" else 0
    threads = settings.num_workers if settings.backend == "thread" else 0
    return (processes, trial.memory_bytes or 0, threads, settings.prefetch_factor or 0)


class Search:
    """One search for the fastest safe settings; run() returns every trial and the chosen one."""

    def __init__(
        self,
        measure: Measure,
        baseline: Settings,
        limits: Limits,
        *,
        budget_s: float,
        trial_s: float,
        batch_bytes: int | None = None,
        keep_up: bool = False,
        quick: bool = False,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[Trial], None] | None = None,
        baseline_run: Measurement | None = None,
    ) -> None:
        self.measure = measure
        self.baseline_settings = baseline
        self.limits = limits
        self.budget_s = budget_s
        self.trial_s = trial_s
        self.batch_bytes = batch_bytes
        self.keep_up = keep_up  # a training step is given: prefer the cheapest settings that keep up with it
        self.quick = quick
        self.clock = clock
        self.progress = progress
        self.trials: list[Trial] = []
        self.out_of_time = False
        self._started = 0.0
        # The baseline's first run, when the caller measured it already (to learn the host's limits from it).
        self._baseline_run = baseline_run

    def run(self) -> SearchResult:
        self._started = self.clock()
        if self._baseline_run is not None:
            baseline = Trial(1, self.baseline_settings, "baseline", "measured")
            self.trials.append(baseline)
            self._record(baseline, self._baseline_run)
        else:
            baseline = self._try(self.baseline_settings, "baseline")
        if baseline is None:
            raise ValueError(f"a budget of {self.budget_s:g} s cannot pay for one trial of {self.trial_s:g} s")
        best = self._climb()
        if not self.quick:
            # The other backend first: a change of kind (no copy of each batch between processes, no process
            # to start) can be worth far more than the few percent a count or a prefetch between refines; tried
            # too where worker processes lost to the main process (memory-heavy: the copy is what they lose).
            self._threads(best or self._fastest())
        if not self.quick and best is not None:
            best = self._between(best)
            best = self._prefetch(best)
        chosen = self._final(baseline)
        return SearchResult(
            trials=self.trials,
            baseline=baseline,
            chosen=chosen,
            seconds=self.clock() - self._started,
            stopped="budget" if self.out_of_time else "converged",
        )

    def so_far(self) -> SearchResult | None:
        """After Ctrl-C: the trials measured so far, with nothing chosen (the baseline stands); None before the
        baseline was measured."""
        if not self.trials or self.trials[0].phase != "baseline":
            return None
        baseline = self.trials[0]
        return SearchResult(self.trials, baseline, baseline, self.clock() - self._started, "interrupted")

    # The phases

    def _climb(self) -> Trial | None:
        """Step up the worker counts while each is faster; return the best process trial with workers."""
        best = self._try(candidate(self.limits, 0), "workers")
        best_with_workers = None
        counts = worker_counts(self.limits)
        for position, count in enumerate(counts[1:], start=1):
            if best_with_workers is not None and self._computing(best_with_workers, count):
                return self._past_the_estimate(best_with_workers, count)
            trial = self._try(candidate(self.limits, count), "workers")
            if trial is None or not trial.usable:
                break  # out of time, or more workers broke it: more still would not mend it
            if best is None or not best.usable or self._ratio(trial, best) >= GAIN:
                best = best_with_workers = trial
            elif count >= 2:
                trial.note = trial.note or f"not {GAIN:.2f}x faster than {best.settings.brief()}: the climb ends"
                break
            if self.keep_up and trial.keeps_up:
                trial.note = "keeps up with the training step: more workers would only cost more"
                break
            if best is trial and _near_limit(trial):
                share = trial.batches_per_s / (trial.limit_batches_per_s or 1)
                trial.note = (
                    f"{'at' if reaches_limit(share) else f'{share:.0%} of'} this host's limit "
                    f"({trial.limit_batches_per_s:.1f} batches/s): more workers cannot do much better"
                )
                if position + 1 < len(counts):
                    return self._past_the_estimate(trial, counts[position + 1])
                break
        return best_with_workers

    def _past_the_estimate(self, best: Trial, count: int) -> Trial:
        """The climb ends at `best` on an estimate (its workers keep the cores busy, or it runs near the host's
        limit); outside quick mode one trial past it checks the estimate: `count` workers with a deeper prefetch,
        more batches in flight to keep the cores busy through the waits that a run's figures do not show (an
        epoch's end, batches delivered in order). On a 2-core host, 8 workers with prefetch 8 ran pure-Python
        loading 5-15% faster than 2 workers with prefetch 2, the cores busy 96% of the time against 90%.
        Not where the workers were kept off the cores they asked for (other processes held them): a gain
        there is CPU won from those processes. Returns the better of the two."""
        if self.quick or self._kept_off(best):
            return best
        trial = self._try(candidate(self.limits, count, prefetch_factor=PAST_PREFETCH), "workers")
        if trial is None or not trial.usable:
            return best
        ratio = self._ratio(trial, best)
        if ratio >= GAIN:
            trial.note = f"{ratio:.2f}x faster than {best.settings.brief()}: past where the estimate ended the climb"
            return trial
        trial.note = trial.note or f"not {GAIN:.2f}x faster than {best.settings.brief()}: the estimate holds"
        return best

    def _between(self, best: Trial) -> Trial:
        """Try the counts halfway to the best's tried neighbours (6 between 4 and 8)."""
        count = best.settings.num_workers
        tried = sorted({t.settings.num_workers for t in self._process_trials() if t.settings.num_workers})
        lower = [c for c in tried if c < count]
        upper = [c for c in tried if c > count]
        for neighbour in (lower[-1] if lower else None, upper[0] if upper else None):
            if neighbour is None or abs(neighbour - count) < 2:
                continue
            trial = self._try(candidate(self.limits, (neighbour + count) // 2), "refine")
            if trial is not None and trial.usable and self._ratio(trial, best) >= GAIN:
                best = trial
        return best

    def _prefetch(self, best: Trial) -> Trial:
        """A larger prefetch for the best count, doubling while it pays."""
        for factor in (f for f in PREFETCH_FACTORS if f > (best.settings.prefetch_factor or 2)):
            settings = candidate(self.limits, best.settings.num_workers, prefetch_factor=factor)
            trial = self._try(settings, "refine")
            if trial is None or not trial.usable or self._ratio(trial, best) < GAIN:
                break
            best = trial
        return best

    def _fastest(self) -> Trial | None:
        usable = [t for t in self.trials if t.usable]
        return max(usable, key=lambda t: t.batches_per_s) if usable else None

    def _threads(self, best: Trial | None) -> None:
        """The thread backend at the best count (2 at least), doubling while it pays (work that releases the
        GIL); `best` is the trial to beat."""
        if not self.limits.threads or best is None:
            return
        previous = None
        count = max(best.settings.num_workers, 2)
        while count <= self.limits.max_workers:
            trial = self._try(candidate(self.limits, count, backend="thread"), "threads")
            if trial is None or not trial.usable:
                return
            if previous is None and trial.batches_per_s < best.batches_per_s / 2:
                trial.note = "threads are much slower here: the work holds the GIL"
                return
            if previous is not None and self._ratio(trial, previous) < GAIN:
                return
            if self.keep_up and trial.keeps_up:
                return
            previous, count = trial, count * 2

    def _final(self, baseline: Trial) -> Trial:
        """Measure the leaders again, halving them, and choose."""
        usable = [t for t in self.trials if t.usable]
        if not usable:
            return baseline
        size = 2 if self.quick else FINALISTS
        if self.keep_up and any(t.keeps_up for t in usable):
            # Cheapest first: the first of them that still keeps up when measured again wins.
            for trial in sorted((t for t in usable if t.keeps_up), key=cost)[:size]:
                if len(trial.runs) < 2:
                    self._again(trial)
                if trial.usable and trial.keeps_up:
                    return trial
            usable = [t for t in self.trials if t.usable]
        leaders = sorted(usable, key=lambda t: t.batches_per_s, reverse=True)[:size]
        rounds = 1 if self.quick else 2
        for round_number in range(rounds):
            for trial in leaders:
                if len(trial.runs) < round_number + 2:
                    self._again(trial)
            leaders = sorted((t for t in leaders if t.usable), key=lambda t: t.batches_per_s, reverse=True)
            leaders = leaders[: max(1, len(leaders) // 2)] if round_number + 1 < rounds else leaders
        if baseline.usable and len(baseline.runs) < 2:
            self._again(baseline)  # the speedup is a ratio of medians, the baseline's included
        pool = [t for t in leaders if t.usable] or [baseline]
        fastest = max(pool, key=lambda t: t.batches_per_s)
        # The cheapest trial as fast as the fastest (within its noise), confirmed by a second run when it had one.
        floor = fastest.batches_per_s * (1 - _noise(fastest))
        for trial in sorted((t for t in self.trials if t.usable), key=cost):
            if trial.batches_per_s < floor:
                continue
            if len(trial.runs) < 2:
                self._again(trial)
            if trial.usable and trial.batches_per_s >= floor:
                return trial
        return fastest

    # Trials and comparisons

    def _try(self, settings: Settings, phase: str) -> Trial | None:
        """The trial of `settings`: the one already made, a new one measured now, one refused by the budgets
        (recorded, never run), or None when no time is left for it."""
        for trial in self.trials:
            if trial.settings == settings:
                return trial
        refusal = refused(settings, self.limits, self.batch_bytes, self._process_trials())
        if refusal is not None:
            verdict, note = refusal
            trial = Trial(len(self.trials) + 1, settings, phase, verdict, note=note)
            self.trials.append(trial)
            self._report(trial)
            return trial
        if not self._affordable():
            return None
        trial = Trial(len(self.trials) + 1, settings, phase, "measured")
        self.trials.append(trial)
        self._run(trial)
        return trial

    def _again(self, trial: Trial) -> bool:
        """Measure a trial once more, when time allows; whether it was."""
        if not trial.usable or not self._affordable():
            return False
        self._run(trial)
        return True

    def _run(self, trial: Trial) -> None:
        self._record(trial, self.measure(trial.settings, self.trial_s))

    def _record(self, trial: Trial, measurement: Measurement) -> None:
        trial.runs.append(measurement)
        if measurement.outcome in ("stalled", "crashed"):
            trial.verdict = measurement.outcome
            trial.note = measurement.error or f"the run {measurement.outcome}"
        elif self._other_data(measurement):
            trial.verdict = "other-data"
            shown = (
                f"every sample came {measurement.copies} times"
                if measurement.copies and measurement.copies > 1
                else f"an epoch held {measurement.epoch_batches} batches where the baseline's held "
                f"{self._baseline_epoch_batches()}"
            )
            trial.note = (
                f"{shown}: the dataset does not split its stream across workers "
                "(torch.utils.data.get_worker_info()), so each one repeats it"
            )
        elif measurement.memory_bytes is not None and measurement.memory_bytes > self.limits.memory_bytes:
            trial.verdict = "over-memory"
            trial.note = (
                f"used {mb(measurement.memory_bytes)}, over the memory budget of {mb(self.limits.memory_bytes)}"
            )
        self._report(trial)

    def _baseline_epoch_batches(self) -> int | None:
        baseline = self.trials[0] if self.trials else None
        known = [] if baseline is None else [run.epoch_batches for run in baseline.runs if run.epoch_batches]
        return known[0] if known else None

    def _other_data(self, measurement: Measurement) -> bool:
        """Whether a whole epoch held another number of batches than the baseline's whole epoch did, or samples
        came more often than the baseline's did."""
        expected = self._baseline_epoch_batches()
        if None not in (expected, measurement.epoch_batches) and measurement.epoch_batches != expected:
            return True
        baseline = self.trials[0] if self.trials else None
        known = [] if baseline is None else [run.copies for run in baseline.runs if run.copies]
        return bool(known) and measurement.copies is not None and measurement.copies > known[0]

    def _ratio(self, trial: Trial, other: Trial) -> float:
        """trial's rate over other's, after measuring a close call again (both to two runs, time allowing)."""
        for _ in range(2):
            ratio = trial.batches_per_s / other.batches_per_s if other.batches_per_s > 0 else float("inf")
            if abs(ratio - 1) > CLOSE:
                return ratio
            again = [t for t in (trial, other) if len(t.runs) < 2]
            if not again or not all(self._again(t) for t in again):
                return ratio
        return trial.batches_per_s / other.batches_per_s if other.batches_per_s > 0 else float("inf")

    def _computing(self, trial: Trial, next_count: int) -> bool:
        """Whether the workers of `trial` already keep the cores busy, or were ready to and kept off them
        (by each other or by other processes), so that `next_count` would only compete for them (its note
        says so). More workers than cores are tried only while the workers wait: beside busy processes, more
        processes only win CPU from them, a gain that comes and goes with their load (PyAV decoding: 8 workers
        chosen beside two CPU hogs where 2 do as well on the quiet machine)."""
        used = trial.loading_cores
        demand = trial.demanded_cores
        workers = trial.settings.num_workers
        if used is None or demand is None or next_count <= self.limits.cores:
            return False
        if demand < COMPUTING * self.limits.cores:
            return False
        ready = demand - used
        kept_off = f", and ready to run on {ready:.1f} more but kept off them" if ready >= 0.05 * demand else ""
        trial.note = (
            f"{plural(workers, 'worker')} already use {used:.1f} of {self.limits.cores:g} cores computing"
            f"{kept_off}: more would only compete for them"
        )
        return True

    def _kept_off(self, trial: Trial) -> bool:
        """Whether the workers of `trial` asked for the cores (COMPUTING of them or more) but used fewer than
        that, the rest of the time ready to run and descheduled."""
        used, demand = trial.loading_cores, trial.demanded_cores
        limit = COMPUTING * self.limits.cores
        return used is not None and demand is not None and used < limit <= demand

    def _process_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.settings.backend == "process" and t.phase != "baseline"]

    def _affordable(self) -> bool:
        left = self.budget_s - (self.clock() - self._started)
        if left >= self.trial_s:
            return True
        self.out_of_time = True
        return False

    def _report(self, trial: Trial) -> None:
        log.info(
            "tune: trial %d %s: %s, %.1f batches/s",
            trial.number,
            trial.settings.brief(),
            trial.verdict,
            trial.batches_per_s,
        )
        if self.progress is not None:
            self.progress(trial)
