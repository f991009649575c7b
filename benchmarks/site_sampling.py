"""What sampling a worker's sites costs: a loop with and without the site profiler, measured side by side.

Usage: python benchmarks/site_sampling.py [ROUNDS]

The table times a loop of samples in this process with nothing watching it, and with a SiteProfiler
sampling its thread every sitesampler.INTERVAL_S (as it samples a worker's main thread), in alternating order:
pure Python (the worst case: the profiler must take the GIL from the loop), numpy, and a loop taking an uncontended
fcntl.flock on a read-only file per sample with the file-lock watch installed (the wrapper's cost per call).
The last row times epochs of 2 persistent DataLoader workers over a pure-Python dataset with a plain
worker_init_fn and with the probe's whole worker hook (stack dumps, file-lock watch, site profiler), after a
first epoch each (the hook's start-up, mostly the watch's scan of the loaded modules, about 10 ms per worker
here, is not in the rates). Each row gives the median samples per second of each, the median of the
per-round ratios with/without, and the microseconds added per sample.
"""

from __future__ import annotations

import fcntl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np
from torch.utils.data import DataLoader, Dataset

from loaderdoctor.workers.filelocks import FileLockWatch
from loaderdoctor.workers.hook import ProbeWorkerHook
from loaderdoctor.workers.sites import SiteProfiler, activity_path, thread_cpu_clock

SAMPLES = 2000


def python_sample(index: int) -> float:
    value = float(index)
    for _ in range(2000):
        value = (value * 1.000001 + 1.0) % 1e6
    return value


_IMAGE = np.random.default_rng(0).random((64, 64, 3), dtype=np.float32)


def numpy_sample(index: int) -> float:
    return float(np.sort(_IMAGE + index, axis=0).sum())


def _flock_sample(path: str) -> Callable[[int], float]:
    def sample(index: int) -> float:
        with open(path, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_SH)  # looked up at call time: the watch's wrapper when installed
            data = f.read(64)
            fcntl.flock(f, fcntl.LOCK_UN)
        return float(len(data) + index)

    return sample


def _rate(sample: Callable[[int], float], count: int) -> float:
    started = time.perf_counter()
    for index in range(count):
        sample(index)
    return count / (time.perf_counter() - started)


def _sampled_rate(sample: Callable[[int], float], count: int, directory: str, watch_locks: bool) -> float:
    ident = threading.get_ident()
    watch = FileLockWatch()
    if watch_locks:
        watch.install()
    profiler = SiteProfiler(activity_path(directory, 0), ident, thread_cpu_clock(ident) or 0, lock_calls=watch.counts)
    profiler.start()
    try:
        return _rate(sample, count)
    finally:
        profiler.stop()
        watch.uninstall()


def _compare_loop(sample: Callable[[int], float], rounds: int, watch_locks: bool) -> tuple[float, float, float]:
    plain_rates, sampled_rates, ratios = [], [], []
    with tempfile.TemporaryDirectory() as directory:
        _rate(sample, SAMPLES // 10)  # warm-up
        for round_number in range(rounds):
            runs = [
                (lambda: _rate(sample, SAMPLES), plain_rates),
                (lambda: _sampled_rate(sample, SAMPLES, directory, watch_locks), sampled_rates),
            ]
            for run, rates in runs if round_number % 2 == 0 else reversed(runs):
                rates.append(run())
            ratios.append(sampled_rates[-1] / plain_rates[-1])
    return statistics.median(plain_rates), statistics.median(sampled_rates), statistics.median(ratios)


class PythonWork(Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> float:
        return python_sample(index)


def _no_hook(worker_id: int) -> None:
    pass


def _epoch_rate(loader: DataLoader) -> float:
    started = time.perf_counter()
    count = sum(len(batch) for batch in loader)
    return count / (time.perf_counter() - started)


def _compare_workers(rounds: int) -> tuple[float, float, float]:
    """Persistent workers, started and warmed up by a first epoch: each round times an epoch of each."""
    plain_rates, hooked_rates, ratios = [], [], []
    with tempfile.TemporaryDirectory() as directory:
        loaders = [
            DataLoader(PythonWork(), batch_size=16, num_workers=2, persistent_workers=True, worker_init_fn=init)
            for init in (_no_hook, ProbeWorkerHook(directory))
        ]
        for loader in loaders:
            _epoch_rate(loader)
        for round_number in range(rounds):
            runs = list(zip(loaders, (plain_rates, hooked_rates), strict=True))
            for loader, rates in runs if round_number % 2 == 0 else reversed(runs):
                rates.append(_epoch_rate(loader))
            ratios.append(hooked_rates[-1] / plain_rates[-1])
        del loaders
    return statistics.median(plain_rates), statistics.median(hooked_rates), statistics.median(ratios)


def _added_us(plain: float, sampled: float) -> float:
    """Microseconds added per sample."""
    return (1 / sampled - 1 / plain) * 1e6


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 7
    header = f"{'loop':<44} {'plain samples/s':>16} {'sampled samples/s':>18} {'sampled/plain':>14} {'us added':>9}"
    print(header)
    print("-" * len(header))
    with tempfile.NamedTemporaryFile() as shared:
        shared.write(b"x" * 4096)
        shared.flush()
        loops = (
            ("pure Python, this process", python_sample, False),
            ("numpy, this process", numpy_sample, False),
            ("flock LOCK_SH per sample, lock watch on", _flock_sample(shared.name), True),
        )
        for label, sample, watch_locks in loops:
            plain, sampled, ratio = _compare_loop(sample, rounds, watch_locks)
            print(f"{label:<44} {plain:>16.0f} {sampled:>18.0f} {ratio:>14.3f} {_added_us(plain, sampled):>9.1f}")
    plain, hooked, ratio = _compare_workers(rounds)
    label = "pure Python, 2 workers, the probe hook"
    print(f"{label:<44} {plain:>16.0f} {hooked:>18.0f} {ratio:>14.3f} {_added_us(plain, hooked):>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
