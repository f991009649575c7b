"""The tuner's decisions, on made-up measurements and a fake clock: what it tries, what it skips, what it picks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loaderdoctor.loader.settings import Settings
from loaderdoctor.tune.space import Limits, grid
from loaderdoctor.tune.strategy import Search, SearchResult
from loaderdoctor.tune.trial import Measurement, Trial

GB = 2**30
TRIAL_S = 2.0


def _limits(**changes) -> Limits:
    values = dict(
        cores=2.0,
        memory_bytes=8 * GB,
        shm_bytes=None,
        max_workers=32,
        start_method="fork",
        pin_memory=False,
        threads=False,
    )
    values.update(changes)
    return Limits(**values)


class FakeHost:
    """Measures from formulas instead of running anything; every run costs its seconds on a fake clock."""

    def __init__(
        self,
        rate: Callable[[Settings], float],
        *,
        cpu_share: float = 0.95,
        ready_share: float | None = None,
        worker_bytes: int = 100 * 2**20,
        noise: list[float] | None = None,
        outcome: Callable[[Settings], str] = lambda s: "completed",
        step_rate: float | None = None,
        epoch_batches: Callable[[Settings], int | None] = lambda s: 100,
        limit: float | None = None,
    ) -> None:
        self.rate = rate
        self.limit = limit  # the host's limit each run measures (limit.py), batches/s
        self.cpu_share = cpu_share
        self.ready_share = ready_share  # of each worker's time, ready to run but descheduled (None: not counted)
        self.worker_bytes = worker_bytes
        self.noise = noise or [1.0]
        self.outcome = outcome
        self.step_rate = step_rate
        self.epoch_batches = epoch_batches
        self.now = 0.0
        self.ran: list[Settings] = []

    def clock(self) -> float:
        return self.now

    def measure(self, settings: Settings, seconds: float) -> Measurement:
        self.now += seconds
        noise = self.noise[len(self.ran) % len(self.noise)]
        self.ran.append(settings)
        outcome = self.outcome(settings)
        rate = self.rate(settings) * noise if outcome == "completed" else 0.0
        processes = settings.num_workers if settings.backend == "process" else 0
        keeps_up = None if self.step_rate is None else self.rate(settings) >= self.step_rate
        return Measurement(
            batches_per_s=rate,
            outcome=outcome,
            seconds=seconds,
            memory_bytes=processes * self.worker_bytes,
            # Each worker computes cpu_share of its time, on at most the 2 cores there are.
            loading_cores=min(self.cpu_share * settings.num_workers, 2.0) if settings.num_workers else None,
            ready_cores=None if self.ready_share is None else self.ready_share * settings.num_workers,
            keeps_up=keeps_up,
            epoch_batches=self.epoch_batches(settings),
            limit_batches_per_s=self.limit,
        )

    def counts_run(self) -> list[int]:
        return [s.num_workers for s in self.ran]


def _search(host: FakeHost, limits: Limits | None = None, *, budget_s: float = 200.0, **options) -> Search:
    return Search(
        host.measure,
        Settings(),
        limits or _limits(),
        budget_s=budget_s,
        trial_s=TRIAL_S,
        clock=host.clock,
        **options,
    )


def _cpu_bound(settings: Settings) -> float:
    """Two cores of pure computing: more workers than cores are no faster; threads hold the GIL."""
    if settings.backend == "thread":
        return 9.0
    return 10.0 * max(1, min(settings.num_workers, 2))


def _io_bound(settings: Settings) -> float:
    """Waiting on I/O: every worker up to 16 adds the same; past 16 the storage is the limit."""
    return 10.0 + 10.0 * min(settings.num_workers, 16)


def test_a_computing_loader_climbs_to_the_cores_and_checks_the_estimate_once():
    host = FakeHost(_cpu_bound, cpu_share=0.95)
    result = _search(host).run()
    assert result.chosen.settings.num_workers == 2
    assert result.chosen.settings.persistent_workers and result.chosen.settings.start_method == "fork"
    assert "computing" in next(t for t in result.trials if t.settings.num_workers == 2).note
    # One trial past the cores checks the estimate, with a deeper prefetch; no count beyond it is tried.
    (past,) = [t for t in result.trials if t.settings.num_workers > 2 and t.phase == "workers"]
    assert (past.settings.num_workers, past.settings.prefetch_factor) == (4, 4)
    assert "the estimate holds" in past.note
    assert max(host.counts_run()) == 4


def test_quick_mode_trusts_the_estimate():
    host = FakeHost(_cpu_bound, cpu_share=0.95)
    _search(host, quick=True).run()
    assert max(host.counts_run()) == 2  # 4 workers on 2 busy cores was never tried


def _beside_hogs(settings: Settings) -> float:
    """CPU-bound on 2 cores that other processes share: every process more wins CPU from them."""
    return {0: 5.0, 1: 5.0, 2: 10.0, 3: 11.5, 4: 13.0}.get(settings.num_workers, 15.0)


@pytest.mark.parametrize("quick", [True, False])
def test_workers_kept_off_the_cores_by_other_processes_are_computing(quick):
    # Two workers on 2 cores beside busy processes: each gets half a core and waits, ready, for the rest. More
    # workers would be faster only by taking CPU from those processes: the count stays at the cores.
    host = FakeHost(_beside_hogs, cpu_share=0.5, ready_share=0.45)
    result = _search(host, quick=quick).run()
    assert result.chosen.settings.num_workers == 2
    assert max(host.counts_run()) == 2
    note = next(t for t in result.trials if t.settings.num_workers == 2 and t.phase == "workers").note
    assert "1.0 of 2 cores computing, and ready to run on 0.9 more but kept off them" in note


def test_workers_that_wait_beside_busy_processes_still_go_past_the_cores():
    host = FakeHost(_io_bound, cpu_share=0.05, ready_share=0.02)
    result = _search(host, quick=True).run()
    assert result.chosen.settings.num_workers >= 8


def test_the_cheapest_within_the_spread_of_the_fastests_runs_wins():
    # Under load that comes and goes, the fastest's runs were 8% apart: a trial 6% slower and far cheaper is as
    # fast within that noise (with quiet runs, 3% apart at most, it would not be).
    def settings_run(rates_by_count: dict[int, list[float]]) -> Search:
        search = Search(lambda s, t: Measurement(0.0, "completed", t), Settings(), _limits(), budget_s=0.0, trial_s=1.0)
        for number, (count, rates) in enumerate(rates_by_count.items(), start=1):
            trial = Trial(number, Settings(num_workers=count), "workers", "measured")
            trial.runs = [Measurement(rate, "completed", 1.0) for rate in rates]
            search.trials.append(trial)
        return search

    noisy = settings_run({0: [5.0, 5.0], 2: [9.4, 9.4], 8: [9.6, 10.4]})
    assert noisy._final(noisy.trials[0]).settings.num_workers == 2
    steady = settings_run({0: [5.0, 5.0], 2: [9.4, 9.4], 8: [10.0, 10.1]})
    assert steady._final(steady.trials[0]).settings.num_workers == 8


def test_a_step_past_the_estimate_that_is_faster_is_taken_and_refined():
    # Workers computing on both cores, yet more batches in flight keep the cores busy through the waits the
    # figures do not show (an epoch's end, batches in order): 4 workers with prefetch 4 are 10% faster.
    def rate(settings: Settings) -> float:
        if settings.num_workers <= 2:
            return 10.0 * max(1, settings.num_workers)
        return 22.0 if (settings.prefetch_factor or 2) >= 4 else 20.5

    host = FakeHost(rate, cpu_share=0.95)
    result = _search(host).run()
    (past,) = [t for t in result.trials if t.settings.num_workers == 4 and t.phase == "workers"]
    assert past.settings.prefetch_factor == 4 and "1.10x faster" in past.note
    assert (result.chosen.settings.num_workers, result.chosen.settings.prefetch_factor) == (4, 4)
    assert 8 not in host.counts_run()
    # The prefetch is refined from the step's: 8 tried next, never 2.
    assert {s.prefetch_factor for s in host.ran if s.num_workers == 4} == {4, 8}


def test_a_loader_waiting_on_io_goes_past_the_cores_and_stops_where_it_stops_gaining():
    host = FakeHost(_io_bound, cpu_share=0.05)
    result = _search(host).run()
    assert result.chosen.settings.num_workers == 16
    assert {4, 8, 16, 32} <= set(host.counts_run())
    assert result.chosen.batches_per_s / result.baseline.batches_per_s == pytest.approx(17.0)


def test_with_a_training_step_the_cheapest_settings_that_keep_up_win():
    host = FakeHost(_io_bound, cpu_share=0.05, step_rate=30.0)  # 2 workers already deliver 30 batches/s
    result = _search(host, keep_up=True).run()
    assert result.chosen.settings.num_workers == 2
    assert max(host.counts_run()) == 2  # the climb stopped as soon as loading kept up
    assert result.chosen.keeps_up


def test_a_close_call_is_measured_again_and_decided_by_medians():
    # 4 workers measure 5% faster once by luck; measured again, both are the same.
    def rate(settings: Settings) -> float:
        return 10.0 * max(1, min(settings.num_workers, 2))

    host = FakeHost(rate, cpu_share=0.3, noise=[1.0, 1.0, 1.0, 1.0, 1.08, 1.0, 1.0, 0.97])
    result = _search(host).run()
    four = next(t for t in result.trials if t.settings.num_workers == 4)
    assert len(four.runs) >= 2
    assert result.chosen.settings.num_workers == 2
    assert 8 not in host.counts_run()


def test_settings_predicted_over_the_memory_budget_are_recorded_and_never_run():
    host = FakeHost(_io_bound, cpu_share=0.05, worker_bytes=GB)
    result = _search(host, _limits(memory_bytes=int(5.5 * GB))).run()
    refused = [t for t in result.trials if t.verdict == "over-memory"]
    assert [t.settings.num_workers for t in refused] == [8, 6]  # 6: halfway between the best, 4, and 8
    assert all(not t.runs and "predicted" in t.note for t in refused)
    assert max(host.counts_run()) == 4
    assert result.chosen.settings.num_workers <= 5


def test_batches_in_flight_that_would_fill_shm_are_refused():
    host = FakeHost(_io_bound, cpu_share=0.05)
    limits = _limits(shm_bytes=2 * GB)
    result = _search(host, limits, batch_bytes=200 * 2**20).run()  # 4 workers x 2 batches x 200 MB = 1.6 GB
    refused = [t.settings for t in result.trials if t.verdict == "over-shm"]
    assert refused and all(s.batches_in_flight * 200 * 2**20 > GB for s in refused)
    assert all(s.batches_in_flight * 200 * 2**20 <= GB for s in host.ran)
    assert result.chosen.settings.num_workers == 2


def test_a_stalled_trial_is_recorded_never_chosen_and_ends_the_climb():
    host = FakeHost(_io_bound, cpu_share=0.05, outcome=lambda s: "stalled" if s.num_workers >= 8 else "completed")
    result = _search(host).run()
    stalled = [t for t in result.trials if t.verdict == "stalled"]
    assert [t.settings.num_workers for t in stalled] == [8]
    assert result.chosen.settings.num_workers != 8 and result.chosen.usable
    assert 16 not in host.counts_run()


def test_the_search_never_starts_a_trial_the_budget_cannot_pay_for():
    host = FakeHost(_io_bound, cpu_share=0.05)
    result = _search(host, budget_s=11.0).run()
    assert len(host.ran) == 5  # 5 trials of 2 s fit in 11 s; a sixth would not
    assert host.now <= 11.0
    assert result.stopped == "budget"


def test_threads_equal_to_processes_win_as_the_cheaper():
    def rate(settings: Settings) -> float:  # work that releases the GIL: threads as fast as processes
        return 10.0 * max(1, min(settings.num_workers, 2))

    host = FakeHost(rate, cpu_share=0.95)
    result = _search(host, _limits(threads=True)).run()
    assert result.chosen.settings.backend == "thread"
    assert result.chosen.settings.num_workers == 2


def test_threads_much_slower_than_processes_are_tried_once_and_dropped():
    host = FakeHost(lambda s: 2.0 if s.backend == "thread" else _cpu_bound(s), cpu_share=0.95)
    result = _search(host, _limits(threads=True)).run()
    threads = [t for t in result.trials if t.settings.backend == "thread"]
    assert len(threads) == 1 and "GIL" in threads[0].note
    assert result.chosen.settings.backend == "process"


def test_rates_within_three_percent_go_to_the_cheaper_settings():
    def rate(settings: Settings) -> float:
        rates = {0: 10.0, 1: 10.0, 2: 20.0, 4: 40.0, 6: 60.0, 8: 80.0, 12: 80.5, 16: 81.0, 32: 81.0}
        return rates[settings.num_workers]

    host = FakeHost(rate, cpu_share=0.05)
    result = _search(host).run()
    assert result.chosen.settings.num_workers == 8


def test_quick_mode_only_climbs_the_worker_counts():
    host = FakeHost(_io_bound, cpu_share=0.05)
    result = _search(host, _limits(threads=True), quick=True).run()
    assert {t.phase for t in result.trials} == {"baseline", "workers"}
    assert result.chosen.settings.num_workers == 16


def test_the_search_tries_far_fewer_settings_than_the_grid():
    host = FakeHost(_io_bound, cpu_share=0.05)
    result = _search(host, _limits(threads=True)).run()
    assert len(host.ran) * 4 <= len(grid(_limits(threads=True)))
    assert result.chosen.settings.num_workers >= 16


def test_a_budget_too_small_for_one_trial_is_refused():
    host = FakeHost(_io_bound)
    with pytest.raises(ValueError, match="cannot pay for one trial"):
        _search(host, budget_s=1.0).run()


def test_workers_that_repeat_an_unsplit_stream_are_caught_by_the_epoch_length():
    # An IterableDataset that ignores get_worker_info(): each worker yields the whole stream again.
    host = FakeHost(_io_bound, cpu_share=0.05, epoch_batches=lambda s: 100 * max(1, s.num_workers))
    result = _search(host).run()
    repeated = [t for t in result.trials if t.verdict == "other-data"]
    assert [t.settings.num_workers for t in repeated] == [2]
    assert "does not split its stream" in repeated[0].note
    assert result.chosen.settings.num_workers <= 1


def test_the_climb_stops_at_the_hosts_limit():
    # Loading that waits: each worker adds 10 batches/s, up to this host's limit of 40 (its cores).
    def search(limit: float | None) -> tuple[FakeHost, SearchResult]:
        host = FakeHost(lambda s: min(10.0 * max(s.num_workers, 1), 40.0), cpu_share=0.2, limit=limit)
        limits = _limits()
        result = Search(host.measure, Settings(), limits, budget_s=200, trial_s=TRIAL_S, clock=host.clock, quick=True)
        return host, result.run()

    unknown, _ = search(None)
    assert 8 in unknown.counts_run()  # without a limit, 8 workers are tried to learn they are no faster
    host, result = search(40.0)
    assert 8 not in host.counts_run() and 4 in host.counts_run()
    (four,) = [t for t in result.trials if t.settings.num_workers == 4 and t.phase == "workers"]
    assert four.note == "at this host's limit (40.0 batches/s): more workers cannot do much better"
    assert result.chosen.settings.num_workers == 4
    assert host.now < unknown.now  # fewer trials, less time


def test_outside_quick_mode_a_climb_stopped_at_the_limit_checks_it_with_one_trial_past_it():
    host = FakeHost(lambda s: min(10.0 * max(s.num_workers, 1), 40.0), cpu_share=0.2, limit=40.0)
    result = _search(host).run()
    (past,) = [t for t in result.trials if t.settings.num_workers > 4 and t.phase == "workers"]
    assert (past.settings.num_workers, past.settings.prefetch_factor) == (8, 4)
    assert "the estimate holds" in past.note
    assert 16 not in host.counts_run()
    assert result.chosen.settings.num_workers == 4


def test_the_thread_backend_is_tried_before_the_counts_and_prefetch_are_refined():
    # Big batches: processes copy each one between processes and gain little; threads share them and win. A budget
    # for the climb (0, 1, 2, 4 workers) and two more trials must spend them on threads, not on 3 workers.
    def rate(settings: Settings) -> float:
        if settings.backend == "thread":
            return 33.0
        return 25.0 if settings.num_workers == 0 else 28.0 + settings.num_workers * 0.2

    host = FakeHost(rate, cpu_share=0.4, epoch_batches=lambda s: 20)
    trials_s = TRIAL_S * 7 + 1.0  # the baseline, the climb of four, two refinements
    result = _search(host, _limits(threads=True), budget_s=trials_s).run()
    refined = host.ran[5:]
    assert refined and refined[0].backend == "thread", host.ran
    assert result.chosen.settings.backend == "thread"


def test_threads_are_tried_even_where_worker_processes_lose_to_the_main_process():
    # memory-heavy, measured: 64 MB batches copied between processes make 1 and 2 workers no faster than none
    # (13.5, 21.6 and 22 batches/s), while 2 threads share them and reach 36.
    def rate(settings: Settings) -> float:
        if settings.backend == "thread":
            return 36.0
        return {0: 22.0, 1: 13.5}.get(settings.num_workers, 21.6)

    host = FakeHost(rate, cpu_share=0.9, epoch_batches=lambda s: 32)
    result = _search(host, _limits(threads=True)).run()
    assert any(s.backend == "thread" for s in host.ran), host.ran
    assert result.chosen.settings.backend == "thread"
