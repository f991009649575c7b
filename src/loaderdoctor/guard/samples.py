"""Bad samples under the guard: the dataset wrapper that names or replaces a sample that raises, and the
reader of the replacements it reports.

on_sample_error="raise": a batch whose samples raise fails with an error of the first failing sample's own
exception class (a ValueError stays a ValueError, so `except ValueError` still catches it), whose message names
every failing index, e.g. "dataset[5] raised ValueError: bad sample 5". The error is made where the sample was
loaded and chained (`raise ... from`) to the original, so the original traceback is kept: printed as the cause
when loading runs in the main process, and inside torch's "Caught ValueError in DataLoader worker process 0.
Original Traceback..." text from a worker (torch re-creates a worker's error from its class and that text).
A class that cannot be made from a message alone (its constructor needs other arguments) gives a
SampleFailure (loaderdoctor.loader.indexed) instead, with the same message and chain. A plain subclass of both
SampleFailure and the user's class was not chosen: torch carries a worker's error to the main process by its
class, which must be importable there, and such a class made on the fly is not.

on_sample_error="skip": a sample that raises is replaced by the next dataset index that loads, counting up
and wrapping at len(dataset): dataset[i] -> dataset[(i + 1) % n], then (i + 2) % n, ..., at most
MAX_REPLACEMENT_TRIES of them (past them, the batch fails as in "raise"). The rule reads neither the seed nor
the rank, so it is the same on every DDP rank and every rerun as long as a sample's failure is itself
repeatable; batches keep their size. It needs integer indices (any sampler over a Dataset with __len__);
other indices fail as in "raise". The replacement is made in the process that loads the batch, and reported
through a small file in the guard's temporary folder (a record per replaced sample, one write each), not in
the batch: the batch stays exactly what the user's collate_fn makes of the samples. Each request the guard's
sampler sends carries a tag (iteration, plan position), so that a report is matched to the batch delivered,
and reports of batches loaded ahead but never delivered (a restart, an epoch left early) are dropped.
"""

from __future__ import annotations

import json
import math
import operator
import os
import tempfile
import traceback
from typing import Any

from loaderdoctor.loader.facts import length_or_none
from loaderdoctor.loader.indexed import IndexedDataset, SampleFailure, parse_sample_failures
from loaderdoctor.workers.currentindex import InHand

ON_SAMPLE_ERROR = ("raise", "skip")
MAX_REPLACEMENT_TRIES = 64
# How sure the guard must be that the dataset's bad share is over max_bad_fraction before it ends a run: a few
# bad samples met early (2 of the first 128 of a dataset with 0.3% bad ones) must not end it by chance.
BAD_SHARE_CONFIDENCE = 0.999
_Z = 3.0902  # the standard normal's quantile at BAD_SHARE_CONFIDENCE, one-sided
_EXACT_UP_TO = 50  # bad samples: the exact binomial bound below it (O(bad) per step), Wilson's above


def _at_least(bad: int, seen: int, share: float) -> float:
    """The chance of `bad` or more failures among `seen` samples when each fails with probability `share`."""
    if share <= 0.0:
        return 0.0
    if share >= 1.0:
        return 1.0
    log_term = seen * math.log1p(-share)  # no failure at all
    logs = [log_term]
    for count in range(1, bad):
        log_term += math.log((seen - count + 1) / count) + math.log(share) - math.log1p(-share)
        logs.append(log_term)
    top = max(logs)
    return max(0.0, 1.0 - math.exp(top) * sum(math.exp(value - top) for value in logs))


def bad_share_floor(bad: int, seen: int) -> float:
    """The least bad share that `bad` failures among `seen` samples allow at BAD_SHARE_CONFIDENCE: the lower end
    of the one-sided Clopper-Pearson interval (exact) for up to _EXACT_UP_TO failures, of Wilson's score interval
    (as good there, and O(1)) above; 0 when nothing failed."""
    if bad <= 0 or seen <= 0:
        return 0.0
    if bad <= _EXACT_UP_TO:
        low, high = 0.0, bad / seen  # the chance of so many failures grows with the share: bisect
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (middle, high) if _at_least(bad, seen, middle) < 1 - BAD_SHARE_CONFIDENCE else (low, middle)
        return low
    share, z2 = bad / seen, _Z * _Z
    spread = _Z * math.sqrt(share * (1 - share) / seen + z2 / (4 * seen * seen))
    return max(0.0, (share + z2 / (2 * seen) - spread) / (1 + z2 / seen))


def too_many_bad(bad: int, seen: int, max_bad_fraction: float) -> bool:
    """Whether the dataset's bad share is over `max_bad_fraction`, all but surely (0: any bad sample is)."""
    if max_bad_fraction <= 0:
        return bad > 0
    return bad_share_floor(bad, seen) > max_bad_fraction


Tag = tuple[int, int]  # (the guard's iterator number, the plan position of the batch)


class Request:
    """An index (or a batch of them) as the guard's sampler sends it to the loading process, with its tag."""

    __slots__ = ("index", "tag")

    def __init__(self, index: Any, tag: Tag) -> None:
        self.index = index
        self.tag = tag

    def __reduce__(self) -> tuple[Any, ...]:
        return (Request, (self.index, self.tag))


class Tagger:
    """Tags each batch of a plan with the guard's iterator number and its plan position, as a Request."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def __call__(self, position: int, batch: Any) -> Request:
        return Request(batch, (self.iteration, position))


def in_original_type(failure: SampleFailure) -> BaseException:
    """The error to raise for samples that failed: of the first one's own class with the failure's message
    (naming every failing index), or the SampleFailure itself when that class cannot be made so."""
    original = failure.__cause__
    if original is None or isinstance(original, SampleFailure):
        return failure
    try:
        error = type(original)(str(failure))
    except Exception:
        return failure
    named = [index for index, _, _ in parse_sample_failures(error)]
    return error if named == [index for index, _, _ in parse_sample_failures(failure)] else failure


class KilledItsWorker(Exception):
    """A sample that killed a worker process before, not loaded again under on_sample_error="skip"."""


class GuardedSamples(IndexedDataset):
    """The user's dataset as the guard's internal loader reads it: samples pass through; one that raises is
    named in the error (untagged requests) or replaced and reported (Requests, under on_sample_error="skip").
    The index being loaded is kept in `in_hand` (see workers/currentindex.py); `killers` are indices that killed a
    worker before (with the death in words), failed without loading them.

    Attributes set on it (a worker_init_fn setting get_worker_info().dataset.handle = ...) go to the user's
    dataset, as reading them does.
    """

    _OWN = frozenset({"inner", "report_path", "in_hand", "killers"})

    def __init__(
        self,
        inner: Any,
        report_path: str | None = None,
        in_hand: InHand | None = None,
        killers: dict[int, str] | None = None,
    ) -> None:
        super().__init__(inner, in_hand)
        self.report_path = report_path  # where replacements are reported; None: no replacing
        self.killers = dict(killers or {})

    def _killed_by(self, index: Any) -> str | None:
        """The death `index` caused before, if it is one of the killers."""
        if not self.killers:
            return None
        try:
            return self.killers.get(operator.index(index))
        except TypeError:  # no integer: none of them
            return None

    def _load(self, index: Any) -> Any:
        death = self._killed_by(index)
        if death is not None:
            raise KilledItsWorker(f"loading it killed a worker process before ({death})")
        return super()._load(index)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, Request):
            if self.report_path is not None:
                return self._sample_or_replacement(index.index, index.tag)
            index = index.index
        try:
            return super().__getitem__(index)
        except SampleFailure as failure:
            raise in_original_type(failure) from failure.__cause__

    def __getitems__(self, indices: Any) -> list[Any]:
        tag = None
        if isinstance(indices, Request):
            indices, tag = indices.index, indices.tag
        if tag is None or self.report_path is None:
            try:
                return super().__getitems__(indices)
            except SampleFailure as failure:
                raise in_original_type(failure) from failure.__cause__
        if hasattr(self.inner, "__getitems__") and not any(self._killed_by(index) for index in indices):
            # The dataset loads whole batches: let it, unless a sample fails (or killed a worker before); then
            # one by one below.
            try:
                return self.inner.__getitems__(indices)
            except Exception:
                pass
        return [self._sample_or_replacement(index, tag) for index in indices]

    def _sample_or_replacement(self, index: Any, tag: Tag) -> Any:
        try:
            return super().__getitem__(index)
        except SampleFailure as failure:
            found = self._replacement(index)
            if found is None:
                raise in_original_type(failure) from failure.__cause__
            replacement, sample = found
            self._report(tag, index, replacement, failure)
            return sample

    def _replacement(self, index: Any) -> tuple[int, Any] | None:
        """(the replacing index, its sample) by the rule in this module's docstring, or None."""
        try:
            start = operator.index(index)
        except TypeError:
            return None
        size = length_or_none(self.inner)
        tries = MAX_REPLACEMENT_TRIES if size is None else min(MAX_REPLACEMENT_TRIES, size - 1)
        for step in range(1, tries + 1):
            candidate = start + step if size is None else (start + step) % size
            try:
                return candidate, self._load(candidate)
            except Exception:
                continue
        return None

    def _report(self, tag: Tag, index: Any, replacement: int, failure: SampleFailure) -> None:
        (_, error_type, message), *_ = parse_sample_failures(failure)
        record = {
            "tag": list(tag),
            "index": operator.index(index),
            "replacement": replacement,
            "error_type": error_type,
            "message": message,
            "traceback": "".join(traceback.format_exception(failure.__cause__ or failure)),
        }
        line = (json.dumps(record) + "\n").encode()
        # One write on a file opened for appending: the records of several workers never interleave.
        descriptor = os.open(self.report_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)


class SkipReports:
    """The main process's side of the reports: the replacements of each delivered batch, by its tag."""

    def __init__(self, folder: str) -> None:
        descriptor, self.path = tempfile.mkstemp(prefix="skipped-", suffix=".jsonl", dir=folder)
        os.close(descriptor)
        self._read_bytes = 0
        self._partial = b""  # the start of a record still being written
        self._pending: dict[Tag, list[dict[str, Any]]] = {}

    def take(self, tag: Tag) -> list[dict[str, Any]]:
        """The records of the batch with `tag`, just delivered; records of batches that will not be delivered
        (an earlier iterator's, or a position passed) are dropped."""
        size = os.stat(self.path).st_size
        if size > self._read_bytes:
            self._read(size)
        if not self._pending:
            return []
        found = self._pending.pop(tag, [])
        iteration, position = tag
        for stale in [t for t in self._pending if t[0] != iteration or t[1] < position]:
            del self._pending[stale]
        return found

    def _read(self, size: int) -> None:
        with open(self.path, "rb") as file:
            file.seek(self._read_bytes)
            data = self._partial + file.read(size - self._read_bytes)
        self._read_bytes = size
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            record = json.loads(line)
            self._pending.setdefault(tuple(record["tag"]), []).append(record)
