"""The tuner against an exhaustive grid and three fixed recipes, on five pipelines of different character.

Usage: python benchmarks/tune.py [--budget S] [--max-workers N] [--rounds R] [--pair-rounds P] [--only NAME ...]
(about an hour for the five pipelines at the defaults on a 2-core machine: the grids take most of it)

Per pipeline (benchmarks/tune_pipelines.py), in one run:
1. the tuner searches with a budget of S seconds (its own trials, its own clock; by default tune's own default
   budget, what a user gets);
2. a plain grid measures every Settings of the same space (tune/space.py grid()) as a user would by hand: a
   plain loop of a freshly built loader, one epoch to warm up and GRID_EPOCHS whole epochs timed, so that every
   setting is measured over the same number of batches, and keeps the fastest; its wall time (warm-up epochs
   included) is the grid's search time;
3. side by side, in alternating order for R rounds, each contender runs a freshly built loader for one epoch to
   warm up and FINAL_EPOCHS whole epochs timed: the
   tuner's choice, the grid's best, PyTorch's defaults
   (num_workers=0), Lightning's heuristic (num_workers = cores // ranks - 1) and the seeds' recipe (4 workers,
   prefetch 2, persistent);
4. then P more rounds of the tuner's choice and the grid's best alone, in alternating order: on a host whose
   speed drifts by several percent from minute to minute, the tuner's ratio needs more rounds than the others'.
The timed epochs count each epoch's start-up where workers start anew every epoch, and not the first start-up
of persistent workers, which a run pays once (as the tool reports it, apart from the rate): these pipelines'
epochs last a second or less, where a real run's last minutes, so counting it would weigh it a hundred times
too much (io-latency: 16 forked workers bring their first batch in 0.26 s, 16 threads in 0.06 s; an epoch
of 100 batches takes about 0.35 s).
The table gives each contender's rate as a ratio to the grid's best, the median over the rounds of each round's
ratio (each round's rate over the same round's grid-best rate; the tuner's choice runs just before or after the
grid's best, in alternating order; the tuner's over its R + P rounds); the lowest and highest of the tuner's
per-round ratios (how far one round's noise moves the ratio); the tuner's own figure for its choice as a ratio
to a plain loop's for it, the median of 3 runs right after the search, before the grid (what tune reports against
what a user's loop gets); and the tuner's search time as a ratio to the grid's.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time

import harness
from loaderdoctor.host.facts import host_facts
from loaderdoctor.loader.settings import LoaderSpec, Settings, quiet_worker_count_advice
from loaderdoctor.probe.measuring import Measuring
from loaderdoctor.tune.run import DEFAULT_BUDGET_S, default_memory_budget, tune_loader
from loaderdoctor.tune.space import grid
from tune_pipelines import PIPELINES

FINAL_EPOCHS = 8
GRID_EPOCHS = 1


def _epochs_rate(spec: LoaderSpec, settings: Settings, epochs: int) -> float:
    """Batches per second over `epochs` whole epochs of a new loader with `settings`, after one epoch to warm up
    (each timed epoch's start-up counted where workers start anew every epoch)."""
    loader = spec.build(settings)

    def end_workers() -> None:  # persistent ones: inside the timed span, as they have always been
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    with quiet_worker_count_advice():
        try:
            return harness.loop_rate(loader, epochs=epochs, warm_up=1, end=end_workers)
        finally:
            end_workers()  # again (a no-op once done) where the loop failed


def _grid_best(spec: LoaderSpec, space: list[Settings]) -> tuple[Settings, float]:
    """The fastest Settings of `space`, each timed over GRID_EPOCHS epochs of a plain loop after one to warm up,
    and the grid's time."""
    started = time.monotonic()
    best, best_rate = space[0], -1.0
    for settings in space:
        rate = _epochs_rate(spec, settings, GRID_EPOCHS)
        if rate > best_rate:
            best, best_rate = settings, rate
    return best, time.monotonic() - started


def _bench(name: str, budget_s: float, max_workers: int, rounds: int, pair_rounds: int) -> dict[str, object]:
    spec = LoaderSpec.from_loader(PIPELINES[name]())
    memory = default_memory_budget()
    host = host_facts()
    tuned = tune_loader(name, Measuring(spec), budget_s=budget_s, memory_bytes=memory, max_workers=max_workers)
    # The plain loop of the tuner's choice right after the search, before the grid's 70-odd loaders have run in
    # this process (costly-startup's choice ran at 111 batches/s before them and 102 after): what the tuner's
    # figure is compared with.
    plain_after_search = statistics.median(_epochs_rate(spec, tuned.settings, FINAL_EPOCHS) for _ in range(3))
    limits = tuned.limits
    space = grid(limits)
    grid_settings, grid_s = _grid_best(spec, space)
    lightning_workers = max(0, int(host.usable_cores) // max(1, host.local_ranks) - 1)
    contenders = {
        "tuner": tuned.settings,
        "grid best": grid_settings,
        "torch defaults": Settings(),
        "lightning": Settings(num_workers=lightning_workers, prefetch_factor=2 if lightning_workers else None),
        "seeds' recipe": Settings(num_workers=4, prefetch_factor=2, persistent_workers=True),
    }
    timed = {who: functools.partial(_epochs_rate, spec, settings, FINAL_EPOCHS) for who, settings in contenders.items()}
    rounds_of_all = list(harness.in_turns(timed, rounds))
    pairs = {who: timed[who] for who in ("tuner", "grid best")}
    rounds_of_pairs = rounds_of_all + list(harness.in_turns(pairs, pair_rounds))
    # Each round's rate over the same round's grid-best rate: the two ran one after the other, so the host's
    # slower and faster minutes (here the same settings read 64 and 89 batches/s a minute apart) cancel.
    ratios = {who: harness.median_ratio(rounds_of_all, who, "grid best") for who in contenders}
    ratios["tuner"] = harness.median_ratio(rounds_of_pairs, "tuner", "grid best")
    tuner_rounds = harness.per_round_ratios(rounds_of_pairs, "tuner", "grid best")
    return {
        "name": name,
        "ratios": ratios,
        "tuner_rounds": (min(tuner_rounds), max(tuner_rounds)),
        "grid_best": statistics.median(r["grid best"] for r in rounds_of_pairs),
        "reported_over_plain": tuned.chosen.batches_per_s / plain_after_search,
        "tuner": tuned.settings.describe(),
        "grid": grid_settings.describe(),
        "tuner_s": tuned.seconds,
        "grid_s": grid_s,
        "grid_size": len(space),
        "trials": len(tuned.trials),
    }


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__, rounds=5)  # side-by-side rounds of the contenders
    parser.add_argument(
        "--budget", type=float, default=DEFAULT_BUDGET_S, help="the tuner's budget per pipeline (s; default tune's)"
    )
    parser.add_argument("--max-workers", type=int, default=16, help="the space's largest worker count")
    parser.add_argument("--pair-rounds", type=int, default=10, help="more rounds of the tuner and the grid's best")
    parser.add_argument("--only", nargs="*", default=list(PIPELINES), choices=list(PIPELINES))
    args = parser.parse_args(argv)
    kept = harness.Results(__file__, args, rounds=args.rounds + args.pair_rounds)
    results = []
    for name in args.only:
        print(f"… {name}", file=sys.stderr, flush=True)
        results.append(_bench(name, args.budget, args.max_workers, args.rounds, args.pair_rounds))
    who = ["tuner", "grid best", "torch defaults", "lightning", "seeds' recipe"]
    extra = ("tuner rounds", "reported/plain", "search/grid")
    header = f"{'pipeline':<15}" + "".join(f"{w:>15}" for w in who) + "".join(f"{e:>16}" for e in extra)
    print(
        f"throughput as a ratio to the grid's best (the median of {args.rounds} side-by-side rounds' ratios, the "
        f"tuner's of {args.rounds + args.pair_rounds}, {FINAL_EPOCHS} epochs after one to warm up); the tuner's "
        f"lowest and highest ratio in one round; its reported rate over a plain loop's; its search time (budget "
        f"{args.budget:g} s) as a ratio to the grid's"
    )
    print(header)
    for r in results:
        ratios = r["ratios"]
        low, high = r["tuner_rounds"]
        print(
            f"{r['name']:<15}"
            + "".join(f"{ratios[w]:>15.2f}" for w in who)
            + f"{f'{low:.2f}-{high:.2f}':>16}{r['reported_over_plain']:>16.2f}{r['tuner_s'] / r['grid_s']:>16.2f}"
        )
    print()
    for r in results:
        same = " (the same settings: the tuner's ratio is the benchmark's noise)" if r["tuner"] == r["grid"] else ""
        print(
            f"{r['name']:<15} tuner: {r['tuner']} ({r['trials']} trials, {r['tuner_s']:.0f} s); grid best: "
            f"{r['grid']} ({r['grid_best']:.1f} batches/s; {r['grid_size']} settings, {r['grid_s']:.0f} s){same}"
        )
        kept.add(**r)
        kept.figures.update({f"{r['name']}: {w} / grid best": r["ratios"][w] for w in who})
        kept.figures[f"{r['name']}: reported/plain"] = r["reported_over_plain"]
        kept.figures[f"{r['name']}: search/grid"] = r["tuner_s"] / r["grid_s"]
    kept.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
