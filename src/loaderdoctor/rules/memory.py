"""Rules about memory: workers that grow after start-up, and pinned memory that does or would do nothing."""

from __future__ import annotations

import statistics

from loaderdoctor.plain.numbers import MIB
from loaderdoctor.plain.words import plural
from loaderdoctor.recording.record import Recording, WorkerReading, mean_batch_bytes
from loaderdoctor.recording.usage import worker_growth, worker_samples_after_startup
from loaderdoctor.rules._common import mb, settings_snippet
from loaderdoctor.rules.finding import Finding

# Growth of a worker's USS after its first batch, per worker, that is named, whether it still rises or not: a
# cost of this size is paid in every worker of every rank however long the check ran.
GROWTH_WARNING_BYTES = 64 * MIB
GROWTH_CRITICAL_BYTES = 256 * MIB  # still rising: it ends in an out-of-memory kill
# Levelled off (a one-time copy), severity goes by what it costs: per worker, and all copies together.
COPY_WARNING_BYTES = 128 * MIB
COPIES_WARNING_BYTES = 1024 * MIB
COPIES_CRITICAL_BYTES = 4096 * MIB
# A worker holds the batches it has built (prefetch_factor of them) and the one it builds, in memory of its own
# until the main process takes them: growth within that many batches is buffers, not growth.
BUFFERED_BATCHES_EXTRA = 1
# A worker still grows when its last third of samples averages this share of its whole growth above its
# middle third: steady growth gives 1/3, a cache that filled up early and stopped gives about 0.
STILL_RISING_SHARE = 0.1
# Pinning pays off when copies to the accelerator are big enough to overlap with compute.
PIN_WORTHWHILE_BATCH_BYTES = 1 * MIB

BOUNDED_CACHE_SNIPPET = """\
import functools

class MyDataset(torch.utils.data.Dataset):
    @functools.lru_cache(maxsize=1024)  # a bound: an unbounded dict cache grows in every worker
    def load(self, path):
        ...

    # and nothing appended per sample to lists or dicts kept on the dataset"""

COMPACT_STORAGE_SNIPPET = """\
# A list of str is copied page by page into every worker that reads it (copy-on-read):
# keep the same data in one numpy buffer plus offsets, which reading leaves untouched.
encoded = [p.encode() for p in paths]
self.offsets = np.cumsum([0] + [len(b) for b in encoded])
self.buffer = np.frombuffer(b"".join(encoded), dtype=np.uint8)

def path(self, i):
    return self.buffer[self.offsets[i] : self.offsets[i + 1]].tobytes().decode()

# and give every cache a bound: @functools.lru_cache(maxsize=1024)"""

PIN_MEMORY_SNIPPET = """\
loader = DataLoader(dataset, batch_size=..., pin_memory=True)
for batch in loader:
    batch = batch.to(device, non_blocking=True)  # the copy overlaps with compute"""


def _still_rising(samples: list[WorkerReading]) -> bool | None:
    """Whether one worker's USS still climbs at the end of the run; None with too few samples to tell."""
    if len(samples) < 3:
        return None
    uss = [s.uss_bytes for s in samples]
    growth = uss[-1] - uss[0]
    middle = statistics.mean(uss[len(uss) // 3 : 2 * len(uss) // 3])
    last = statistics.mean(uss[2 * len(uss) // 3 :])
    return growth > 0 and last - middle >= STILL_RISING_SHARE * growth


def _named_growth_bytes(rec: Recording) -> float:
    """The least growth per worker that is named: GROWTH_WARNING_BYTES, or more where a worker's own batches
    in flight could account for it."""
    batch_bytes = mean_batch_bytes(rec) or 0.0
    buffered = (rec.settings.prefetch_factor or 2) + BUFFERED_BATCHES_EXTRA
    return max(float(GROWTH_WARNING_BYTES), buffered * batch_bytes)


def _growth_fix(rec: Recording, still_rising: bool, each_mb: float, total_mb: float, copies: str) -> str:
    """Why workers grow, in the words of how they were started and whether the growth levelled off."""
    cost = f"{each_mb:g} MB in every worker, {total_mb:g} MB in all ({copies})"
    if rec.start_method == "fork" and still_rising:
        return (
            "Forked workers copy every Python object they touch (copy-on-read, pytorch#13246), and caches that "
            "never stop growing add to it: keep per-sample lists and dicts in numpy arrays or one buffer plus "
            "offsets, and bound caches (functools.lru_cache(maxsize=...))."
        )
    if rec.start_method == "fork":
        return (
            "Forked workers share the parent's memory only until they write to it, and reading a Python object "
            "writes its reference count: each worker copies every page of the dataset's lists, dicts and strings "
            f"it reads (copy-on-read, pytorch#13246), or fills a cache once. It stopped growing, but the copy is "
            f"paid once per worker: {cost}, more with every worker added. Keep such data in numpy arrays or one "
            "buffer plus offsets, which reading leaves shared."
        )
    if still_rising:
        return (
            f"Workers started with {rec.start_method} hold their own copy of the dataset from the start, so "
            "this growth is the workers' own doing after their first batch: a cache or a list that grows with "
            "every sample. Bound caches (functools.lru_cache(maxsize=...)) and keep nothing per sample."
        )
    return (
        f"Workers started with {rec.start_method} hold their own copy of the dataset from the start; after their "
        f"first batch each one also loaded data on first use or filled a cache once: {cost}. It stopped growing, "
        "but every worker pays it: load it before the workers start into one numpy array or a memory-mapped "
        "file they share, or bound the cache (functools.lru_cache(maxsize=...))."
    )


def memory_growth(rec: Recording) -> Finding | None:
    """Workers' memory grew after their first batch: still rising (a leak or an unbounded cache), or levelled
    off (a one-time copy paid in every worker), with what it costs in all."""
    growth = worker_growth(rec)
    if not growth:
        return None
    growth_bytes = statistics.median(last - first for first, last, _ in growth.values())
    if growth_bytes < _named_growth_bytes(rec):
        return None
    rising = [r for r in map(_still_rising, worker_samples_after_startup(rec).values()) if r is not None]
    # Too few readings to tell a leak from a one-time copy (a short run): the growth itself is named all the same.
    still_rising = sum(rising) * 2 >= len(rising) if rising else None
    workers, ranks = max(1, rec.settings.num_workers), max(1, rec.host.local_ranks)
    total_bytes = growth_bytes * workers * ranks
    seconds = statistics.median(s for _, _, s in growth.values())
    growth_mb, total_mb = mb(growth_bytes), mb(total_bytes)
    copies = plural(workers, "worker") + (f" × {ranks} local ranks" if ranks > 1 else "")
    if still_rising is None:
        severity = "warning"
        title = (f"Each worker's memory grew by {growth_mb:g} MB in {seconds:.1f} s after start-up (too few "
                 "readings to tell whether it still grows)")  # fmt: skip
    elif still_rising:
        severity = "critical" if growth_bytes >= GROWTH_CRITICAL_BYTES else "warning"
        title = f"Each worker's memory grew by {growth_mb:g} MB in {seconds:.0f} s after start-up and is still growing"
    else:
        if total_bytes >= COPIES_CRITICAL_BYTES:
            severity = "critical"
        elif growth_bytes >= COPY_WARNING_BYTES or total_bytes >= COPIES_WARNING_BYTES:
            severity = "warning"
        else:
            severity = "info"
        title = (
            f"Each worker's memory grew by {growth_mb:g} MB after its first batch and then levelled off: "
            f"{total_mb:g} MB in all ({copies})"
        )
    return Finding(
        rule="memory-growth",
        severity=severity,
        title=title,
        evidence={
            "workers": len(growth),
            "uss_start_mb": mb(statistics.median(first for first, _, _ in growth.values())),
            "uss_end_mb": mb(statistics.median(last for _, last, _ in growth.values())),
            "growth_mb_per_worker": growth_mb,
            # A rate only means something while it lasts: a levelled-off growth's would fall with the run's length.
            "growth_mb_per_min": round(growth_bytes / MIB / seconds * 60, 1) if seconds > 0 and still_rising else None,
            "seconds": round(seconds, 1),
            "start_method": rec.start_method,
            "still_rising": still_rising,
            "local_ranks": ranks,
            "total_mb": total_mb,
        },
        fix=_growth_fix(rec, still_rising is not False, growth_mb, total_mb, copies),
        snippet=COMPACT_STORAGE_SNIPPET if rec.start_method == "fork" else BOUNDED_CACHE_SNIPPET,
        settings_change={},
        # It costs memory, not time; the size only ranks it among other findings.
        impact=min(1.0, growth_bytes / (1024 * MIB)),
    )


def pin_memory(rec: Recording) -> Finding | None:
    """pin_memory set without an accelerator, or left off with one and large batches: worth knowing."""
    accelerator = rec.host.accelerator
    batch_bytes = mean_batch_bytes(rec)
    if rec.settings.pin_memory and accelerator is None:
        change = {"pin_memory": False}
        return Finding(
            rule="pin-memory",
            severity="info",
            title="pin_memory=True does nothing without an accelerator",
            evidence={"pin_memory": True, "accelerator": None},
            fix="Pinned memory only speeds up copies to an accelerator; without one, turn it off.",
            snippet=settings_snippet(rec, change),
            settings_change=change,
        )
    if accelerator == "cuda" and not rec.settings.pin_memory and batch_bytes is not None:
        if batch_bytes < PIN_WORTHWHILE_BATCH_BYTES:
            return None
        # No settings change: the gain is in the training loop's copy, which a probe does not measure.
        return Finding(
            rule="pin-memory",
            severity="info",
            title=f"Batches of {mb(batch_bytes):g} MB are copied to {accelerator} from unpinned memory",
            evidence={"pin_memory": False, "accelerator": accelerator, "batch_mb": mb(batch_bytes)},
            fix=(
                "With pin_memory=True and .to(device, non_blocking=True), copying a batch to the accelerator "
                "overlaps with compute instead of blocking it."
            ),
            snippet=PIN_MEMORY_SNIPPET,
            settings_change={},
        )
    return None
