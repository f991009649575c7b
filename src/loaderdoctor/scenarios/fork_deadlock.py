"""fork-deadlock: a thread in the training process holds a lock the dataset needs when workers are forked.

Reproduces the hang of a loader whose workers are forked while another thread of the parent holds a lock
(here a metrics flusher; in the field CUDA, OpenCV or OpenMP pools, a pin-memory thread, torch.compile's
workers or a client library's background thread). fork copies the lock in its held state but not the
thread that would release it, so every worker blocks forever on its first sample and the training loop
waits with no error (the DataLoader's default timeout=0 waits forever). The fix:
multiprocessing_context="forkserver" (or "spawn") with persistent workers, so that workers start from a
clean process and import their own, free, lock; or create loaders before starting any thread.
"""

from __future__ import annotations

import functools
import threading
import time

import torch
from torch.utils.data import DataLoader

from loaderdoctor.loader.workload import Workload
from loaderdoctor.scenarios._pipelines import ImageDataset

SUMMARY = "a metrics-flusher thread holds the stats lock while fork copies it: forked workers hang"

FLUSH_S = 0.25  # the flusher uploads for this long at a time, holding the lock, back to back
START_TIMEOUT_S = 10.0

# Guards the per-sample counters. The flusher holds it nearly all the time; a reader in this process says
# it is waiting (_readers_waiting, _reader_arrived) and the flusher lets it in between two uploads, so in
# the parent a reader only ever waits briefly.
_stats_lock = threading.Lock()
_samples_loaded: dict[int, int] = {}
_readers_lock = threading.Lock()  # guards _readers_waiting; only readers take it
_readers_waiting = 0
_reader_arrived = threading.Event()
_flusher: MetricsFlusher | None = None


class MetricsFlusher(threading.Thread):
    """Uploads the sample counters, holding the stats lock while it does; lets waiting readers in between."""

    def __init__(self) -> None:
        super().__init__(name="metrics-flusher", daemon=True)
        self.holding = threading.Event()  # set while this thread holds _stats_lock
        self.stopping = threading.Event()

    def run(self) -> None:
        _stats_lock.acquire()
        self.holding.set()
        try:
            while not self.stopping.is_set():
                if not _reader_arrived.wait(FLUSH_S):
                    continue  # one more upload, the lock still held
                _reader_arrived.clear()
                if _readers_waiting == 0:
                    continue
                self.holding.clear()
                _stats_lock.release()
                while _readers_waiting and not self.stopping.is_set():
                    time.sleep(0.0005)  # every waiting reader takes the lock in turn
                _stats_lock.acquire()
                self.holding.set()
        finally:
            self.holding.clear()
            _stats_lock.release()

    def stop(self) -> None:
        self.stopping.set()
        self.join()


def _count_waiting_reader(change: int) -> None:
    global _readers_waiting
    with _readers_lock:
        _readers_waiting += change


def record_sample(index: int) -> None:
    """Count one loaded sample under the stats lock."""
    _count_waiting_reader(+1)
    try:
        _reader_arrived.set()
        _stats_lock.acquire()  # no timeout: in a forked worker nothing will ever release it
    finally:
        _count_waiting_reader(-1)
    try:
        _samples_loaded[index] = _samples_loaded.get(index, 0) + 1
    finally:
        _stats_lock.release()
    flusher = _flusher
    if flusher is not None and flusher.is_alive():
        # Return only once the flusher holds the lock again, so that a fork right after finds it held.
        flusher.holding.wait(START_TIMEOUT_S)


class CountedImages(ImageDataset):
    """Images that count every sample they load in the process-wide stats."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        record_sample(index)
        return super().__getitem__(index)


def _start_flusher() -> MetricsFlusher:
    global _flusher
    if _flusher is not None and _flusher.is_alive():
        raise RuntimeError("a fork-deadlock workload is still open: close it before building another")
    flusher = MetricsFlusher()
    flusher.start()
    if not flusher.holding.wait(START_TIMEOUT_S):
        flusher.stop()
        raise RuntimeError("the metrics flusher did not take the stats lock")
    _flusher = flusher
    return flusher


def _stop_flusher(flusher: MetricsFlusher) -> None:
    global _flusher
    flusher.stop()
    if _flusher is flusher:
        _flusher = None


def build() -> Workload:
    flusher = _start_flusher()  # started before the loader's workers, as a metrics client starts at import
    dataset = CountedImages(count=320, size=112, crop=96)
    loader = DataLoader(dataset, batch_size=32, num_workers=2)
    return Workload(train=loader, step_ms=50, on_close=functools.partial(_stop_flusher, flusher))
