"""Whether check's verdict holds on a busy machine: each loader checked quiet, beside one CPU hog and beside two
(`python3 -c "while True: pass"`, one core each), N runs of each, and every verified speedup compared with a
plain training loop's measured under the same load.

Usage: python benchmarks/busy_verdicts.py [--runs N] [--budget S] [--loads 0,1,2] [--plain-s S] [--rounds N]
       [NAME ...]

The loaders (defined here, none of them a built-in scenario, each a habit of real pipelines):
- shards: tar-like shards streamed by an IterableDataset split by worker, 2 workers started each epoch, a 50 ms
  step: healthy;
- map-healthy: a numpy map-style dataset, 2 persistent workers, a 50 ms step: healthy;
- audio: log-mel spectrograms with torch.stft in the main process (num_workers=0): CPU-bound, starved;
- spawn-shards: the same shards with spawned workers started each epoch (each imports torch again): the start-up
  every epoch is the cost, and fewer epochs fit a budget beside the hogs;
- lazy-open: a file opened on first use in each worker (0.5 s), 2 workers started each epoch: the start-up
  every epoch is the cost;
- io-wait: 6 ms of waiting on storage per sample in 1 worker: I/O-bound, more workers than cores pay.

For each check: its main finding (rule and severity, or none), the verified fix's verdict, speedup and the spread
of its pairs of windows; then, for a verified fix, plain loops (a fresh process per run: a warm-up epoch, then
whole epochs with the same training step for --plain-s seconds, start-ups included) of the original settings and of
the fix, --rounds rounds in turns (the order reversed every other round) under the same load: their speedup over
all rounds, the lowest and highest of the rounds' speedups, and check's speedup over the plain loops'. A summary
per loader says whether the main finding was the same in every run, whether a healthy loader got a critical
finding under load, and whether every verified speedup was within 25% of the plain loops' or, under load, within
the range of the plain loops' own rounds (where the truth itself moves that much under the load, a figure inside
its range is as right as the plain loops' mean), or the report said no figure was fair (Verification.unsteady:
the direction and the range only; not-measured is no miss either). The benchmark
measures and prints; it asserts nothing and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import harness
from harness.shared_datasets import LazyOpen, Waiting
from loaderdoctor.loader.workload import Workload

CHECK_TIMEOUT_S = 600
PLAIN_TIMEOUT_S = 120
GOAL_SPEEDUP_DIFF = 0.25


# The loaders


class Shards(IterableDataset):
    """16 shards of 64 records each (a record: 2 KB of bytes, decoded into a float tensor), each worker reading
    its own shards."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for shard in range(worker, 16, workers):
            rng = np.random.default_rng(shard)
            for _ in range(64):
                record = rng.bytes(2048)
                yield torch.from_numpy(np.frombuffer(record, dtype=np.uint8).astype(np.float32) / 255.0)


class Table(Dataset):
    """Rows of a numpy table, normalised."""

    def __init__(self) -> None:
        self.rows = np.random.default_rng(0).standard_normal((2048, 256)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        row = self.rows[index]
        return torch.from_numpy((row - row.mean()) / (row.std() + 1e-6))


class Clips(Dataset):
    """One-second clips at 16 kHz as log-mel-like spectrograms (torch.stft, a power, a log)."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(index)
        wave = torch.randn(16000, generator=generator)
        spectrum = torch.stft(wave, n_fft=1024, hop_length=64, window=torch.hann_window(1024), return_complex=True)
        return torch.log1p(spectrum.abs().pow(2))[:128]


def shards() -> Workload:
    return Workload(DataLoader(Shards(), batch_size=32, num_workers=2), step_ms=50)


def spawn_shards() -> Workload:
    return Workload(DataLoader(Shards(), batch_size=32, num_workers=2, multiprocessing_context="spawn"), step_ms=50)


def map_healthy() -> Workload:
    return Workload(DataLoader(Table(), batch_size=64, num_workers=2, persistent_workers=True), step_ms=50)


def audio() -> Workload:
    return Workload(DataLoader(Clips(), batch_size=8), step_ms=10)


def lazy_open() -> Workload:
    # a file each worker opens on first use (0.5 s, as an archive's index is read)
    return Workload(DataLoader(LazyOpen(0.5, 384), batch_size=16, num_workers=2), step_ms=10)


def io_wait() -> Workload:
    # samples that wait on storage 6 ms each
    return Workload(DataLoader(Waiting(0.006, 256), batch_size=8, num_workers=1, persistent_workers=True), step_ms=10)


LOADERS = {
    "shards": shards,
    "spawn-shards": spawn_shards,
    "map-healthy": map_healthy,
    "audio": audio,
    "lazy-open": lazy_open,
    "io-wait": io_wait,
}


# The plain loop


@dataclass(frozen=True)
class Suite:
    """The loaders a run of this benchmark checks: the script that defines them (check's TARGET is
    SCRIPT:function, the function's name the loader's with '-' as '_'), each by its name, and the healthy ones
    (a critical finding on one of them is a false alarm). benchmarks/library_verdicts.py brings its own."""

    script: Path
    loaders: dict[str, Callable[[], Workload]]
    healthy: frozenset[str]
    doc: str


SUITE = Suite(Path(__file__).resolve(), LOADERS, frozenset({"shards", "map-healthy"}), __doc__ or "")


def plain_in_process(suite: Suite, name: str, settings: dict, seconds: float) -> float:
    """Batches per second of whole epochs (start-ups included), after one epoch to warm up."""
    from loaderdoctor.loader.settings import LoaderSpec, Settings

    workload = suite.loaders[name]()
    step_s = (workload.step_ms or 0.0) / 1000
    loader = LoaderSpec.from_loader(workload.train).build(Settings.from_dict(settings))
    return harness.loop_rate(loader, lambda _: time.sleep(step_s), warm_up=1, seconds=seconds)


def plain_rate(suite: Suite, name: str, settings: dict, seconds: float) -> float | None:
    command = [sys.executable, str(suite.script), "--plain", name, json.dumps(settings), str(seconds)]
    return harness.figure_in_fresh_process(command, PLAIN_TIMEOUT_S)


# Load


@contextlib.contextmanager
def hogs(count: int) -> Iterator[None]:
    """`count` one-core busy processes for the block's time, always ended."""
    started = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5 if count else 0.0)
        yield
    finally:
        for process in started:
            process.kill()
        for process in started:
            process.wait()


# One check


@dataclass
class Row:
    name: str
    load: int
    run: int
    main: str  # "rule (severity)" or "none"
    critical: bool
    verdict: str | None = None
    fix: str | None = None
    check_speedup: float | None = None
    plain_speedup: float | None = None
    check_rates: tuple[float, float] | None = None  # the original's and the fix's, in check's windows
    plain_rates: tuple[float, float] | None = None
    busy_pairs: int = 0
    under_load: bool = False  # the report says the speedup is the machine's under that load
    unsteady: bool = False  # the report says no one figure is fair under that load, and gives the range
    check_spread: tuple[float, float] | None = None  # the lowest and highest of check's pairs of windows
    plain_spread: tuple[float, float] | None = None  # the lowest and highest of the plain loops' rounds

    @property
    def within(self) -> bool | None:
        """Whether check's speedup is within GOAL_SPEEDUP_DIFF of the plain loops' or, under load, within the
        range of the plain loops' own rounds (None: nothing to compare)."""
        if self.ratio is None or self.check_speedup is None:
            return None
        if abs(self.ratio - 1) <= GOAL_SPEEDUP_DIFF or self.unsteady:
            return True
        low, high = self.plain_spread or (0.0, 0.0)
        return self.load > 0 and low <= self.check_speedup <= high

    @property
    def ratio(self) -> float | None:
        if self.check_speedup is None or not self.plain_speedup:
            return None
        return self.check_speedup / self.plain_speedup


def check(suite: Suite, name: str, load: int, run: int, budget_s: float, plain_s: float, rounds: int) -> Row:
    target = f"{suite.script}:{name.replace('-', '_')}"
    with hogs(load):
        report = harness.check_json(target, ["--no-history", "--budget", str(budget_s)], CHECK_TIMEOUT_S)
        (loader,) = report["loaders"].values()
        findings = loader["findings"]
        main = f"{findings[0]['rule']} ({findings[0]['severity']})" if findings else "none"
        row = Row(name, load, run, main, any(f["severity"] == "critical" for f in findings))
        verification = loader.get("verification")
        if verification is None:
            return row
        row.verdict = verification["verdict"]
        row.fix = ", ".join(f"{k}={v}" for k, v in verification["settings"].items() if v is not None)
        row.check_speedup = verification["speedup"]
        row.check_rates = (verification["before"], verification["after"])
        row.busy_pairs = verification.get("busy_window_pairs") or 0
        row.under_load = bool(verification.get("under_load"))
        row.unsteady = bool(verification.get("unsteady"))
        row.check_spread = tuple(verification["spread"]) if verification.get("spread") else None
        if row.check_speedup is not None:
            plain_in_turns(row, suite, name, loader["recording"]["settings"], verification["settings"], plain_s, rounds)
    return row


def plain_in_turns(row: Row, suite: Suite, name: str, original: dict, fix: dict, seconds: float, rounds: int) -> None:
    """The plain loops of the original settings and of the fix, `rounds` rounds in turns (the order reversed
    every other round, as check's windows are), under the load of the check: the speedup of their rates over
    all rounds, and the lowest and highest of the rounds' speedups (how much the truth itself moves under that
    load)."""
    contenders = {
        "before": lambda: plain_rate(suite, name, original, seconds),
        "after": lambda: plain_rate(suite, name, fix, seconds),
    }
    pairs = [(r["before"], r["after"]) for r in harness.in_turns(contenders, rounds) if r["before"] and r["after"]]
    if not pairs:
        return
    before, after = sum(b for b, _ in pairs) / len(pairs), sum(a for _, a in pairs) / len(pairs)
    row.plain_rates = (before, after)
    row.plain_speedup = after / before
    speedups = [a / b for b, a in pairs]
    row.plain_spread = (min(speedups), max(speedups))


def _rates(rates: tuple[float, float] | None) -> str:
    return "-" if rates is None else f"{rates[0]:.1f} -> {rates[1]:.1f}"


def _spread(spread: tuple[float, float] | None) -> str:
    return "-" if spread is None else f"{spread[0]:.2f}-{spread[1]:.2f}"


COLUMNS = [
    harness.Column("loader", 12, align="<"),
    harness.Column("hogs", 4),
    harness.Column("run", 3),
    harness.Column("main finding", 28, align="<", gap=1),
    harness.Column("verdict", 14, align="<"),
    harness.Column("check b/s", 14),
    harness.Column("check", 7, ".2f", "x"),
    harness.Column("pairs", 11),
    harness.Column("plain b/s", 14),
    harness.Column("plain", 7, ".2f", "x"),
    harness.Column("rounds", 11),
    harness.Column("ratio", 6),
    harness.Column("fix", align="<", gap=1),
]


def main(argv: list[str], suite: Suite | None = None) -> int:
    suite = suite or SUITE
    parser = harness.parser(suite.doc, rounds=3)
    parser.add_argument("names", nargs="*", default=list(suite.loaders))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--loads", default="0,1,2", help="CPU hogs beside each check, comma-separated")
    parser.add_argument("--plain-s", type=float, default=4.0, help="seconds of each plain loop")
    parser.add_argument("--plain", nargs=3, metavar=("NAME", "SETTINGS", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain:  # one plain loop, in the fresh process plain_rate starts
        print(plain_in_process(suite, args.plain[0], json.loads(args.plain[1]), float(args.plain[2])))
        return 0
    loads = [int(n) for n in args.loads.split(",")]
    print(f"{os.cpu_count()} cores; check --budget {args.budget:g}; {args.runs} runs per load; hogs {loads}")
    table = harness.Table(COLUMNS, rule=False)
    table.header()
    results = harness.Results(str(suite.script), args)
    rows: list[Row] = []
    for name in args.names:
        for load in loads:
            for run in range(args.runs):
                row = check(suite, name, load, run, args.budget, args.plain_s, args.rounds)
                rows.append(row)
                mark = "~" if row.unsteady else "*" if row.under_load else " "
                table.row(name, load, run, row.main, row.verdict or "-", _rates(row.check_rates), row.check_speedup,
                          _spread(row.check_spread), _rates(row.plain_rates), row.plain_speedup,
                          _spread(row.plain_spread), harness.shown(row.ratio, ".2f", mark), row.fix or "")  # fmt: skip
                results.add(**dataclasses.asdict(row), ratio=row.ratio, within=row.within)
    print("\nper loader: main finding the same in every run; healthy loaders without a critical finding under load;")
    print(f"verified speedups within {GOAL_SPEEDUP_DIFF:.0%} of the plain loops' under the same load, or, under load,")
    print("within the range of the plain loops' own rounds, or said by the report to be no fair figure (~); *: every")
    print("pair of the report was busy")
    for name in args.names:
        mine = [r for r in rows if r.name == name]
        mains = sorted({r.main.split(" (")[0] for r in mine})
        same = len(mains) == 1
        healthy_ok = name not in suite.healthy or not any(r.critical for r in mine)
        ratios = [r.ratio for r in mine if r.ratio is not None]
        within = all(r.within is not False for r in mine)
        health = (
            "faulty" if name not in suite.healthy else "healthy: no critical" if healthy_ok else "healthy: CRITICAL"
        )
        shown = ", ".join(f"{r:.2f}" for r in ratios) or "none verified"
        print(
            f"{name:12} main {'same' if same else 'DIFFERS'} ({', '.join(mains)}); {health}; "
            f"speedups {'within' if within else 'NOT within'} ({shown})"
        )
        results.figures[f"{name}: check/plain speedup, median"] = harness.median(ratios)
    results.write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
