"""Errors raised in workers that say what failed once they reach the main process: a map-style dataset wrapper's
name the index of each sample that raised, and a worker_init_fn's say so, with where it raised."""

from __future__ import annotations

import re
from typing import Any

from torch.utils.data import Dataset

# The index travels inside the message: a worker's exception reaches the main process re-created from its
# type and text only (torch's ExceptionWrapper), so attributes would be lost on the way.
_FAILURE = re.compile(r"dataset\[(?P<index>-?\d+)\] raised (?P<type>[\w.]+): (?P<message>[^\n]*)")
_SEPARATOR = "\n"


# A note on the worker_init_fn's own error: torch re-raises it in the main process as its own class (the drop-in
# must raise what a plain loader raises), with its traceback's text, notes included, as the message.
_INIT_MARK = "loaderdoctor: worker_init_fn raised "
_INIT_FAILURE = re.compile(re.escape(_INIT_MARK) + r"(?P<what>[^\n]*)")


def note_worker_init_failure(error: BaseException) -> None:
    """In a worker: a note on the worker_init_fn's `error` of where the user's code raised it; the error keeps its
    class, so that the loop's `except` catches it as it would without loaderdoctor."""
    from loaderdoctor.plain.usercode import describe_exception

    error.add_note(_INIT_MARK + describe_exception(error))


def parse_worker_init_failure(error: BaseException) -> str | None:
    """In the main process: what the worker_init_fn raised ("ValueError: msg (at data.py:12 in init)"), when
    `error` is its failure re-raised from a worker; else None."""
    found = _INIT_FAILURE.search(str(error))
    return found["what"].strip() if found else None


class SampleFailure(Exception):
    """Samples could not be loaded; the message names each one's index and original error, a line each."""


def sample_failure(failures: list[tuple[Any, BaseException]]) -> SampleFailure:
    return SampleFailure(
        _SEPARATOR.join(
            f"dataset[{index}] raised {type(error).__name__}: {_first_line(error)}" for index, error in failures
        )
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def parse_sample_failures(error: BaseException) -> list[tuple[int | None, str, str]]:
    """(index or None, original error type, first line of its message) for each sample that failed in an error
    raised while loading a batch; one entry with no index when the error does not name samples."""
    found = [(int(m["index"]), m["type"], m["message"].strip()) for m in _FAILURE.finditer(str(error))]
    return found or [(None, type(error).__name__, _first_line(error))]


class IndexedDataset(Dataset):
    """Passes every item through; a batch in which items raise becomes one SampleFailure naming them all. With
    `in_hand` (an InHand, see workers/currentindex.py), each worker notes the index it is loading, so that a
    death names it."""

    def __init__(self, inner: Any, in_hand: Any = None) -> None:
        self.inner = inner
        self.in_hand = in_hand

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: Any) -> Any:
        try:
            return self._load(index)
        except Exception as error:
            raise sample_failure([(index, error)]) from error

    def _load(self, index: Any) -> Any:
        """One sample of the user's dataset, as is, noted in hand while it loads."""
        in_hand = self.in_hand
        if in_hand is None:
            return self.inner[index]
        in_hand.loading(index)
        try:
            return self.inner[index]
        finally:
            in_hand.done()

    def __getitems__(self, indices: list[Any]) -> list[Any]:
        # torch loads a batch through __getitems__ when a dataset has it: every sample is tried, so that all
        # the bad ones of a batch are named, not only the first.
        if hasattr(self.inner, "__getitems__"):
            try:
                return self.inner.__getitems__(indices)
            except Exception:
                pass  # load them one by one below, to find the samples at fault
        samples, failures = [], []
        for index in indices:
            try:
                samples.append(self._load(index))
            except Exception as error:
                failures.append((index, error))
        if failures:
            raise sample_failure(failures) from failures[0][1]
        return samples

    def __getattr__(self, name: str) -> Any:
        # Code in workers may reach the dataset through get_worker_info().dataset: keep its attributes.
        if name in ("inner", "in_hand"):
            raise AttributeError(name)
        return getattr(self.inner, name)
