"""A map-style dataset wrapper whose errors name the index of the sample that raised them."""

from __future__ import annotations

import re
from typing import Any

from torch.utils.data import Dataset

# The index travels inside the message: a worker's exception reaches the main process re-created from its
# type and text only (torch's ExceptionWrapper), so attributes would be lost on the way.
_MESSAGE = re.compile(r"dataset\[(?P<index>-?\d+)\] raised (?P<type>[\w.]+): (?P<message>.*)", re.S)


class SampleFailure(Exception):
    """A sample could not be loaded; the message names its index and the original error."""


def sample_failure(index: Any, error: BaseException) -> SampleFailure:
    return SampleFailure(f"dataset[{index}] raised {type(error).__name__}: {error}")


def parse_sample_failure(error: BaseException) -> tuple[int | None, str, str]:
    """(index or None, original error type, original message) of an error raised while loading a batch."""
    match = _MESSAGE.search(str(error))
    if match is None:
        return None, type(error).__name__, str(error).strip().splitlines()[-1] if str(error).strip() else ""
    first_line = match["message"].strip().splitlines()[0] if match["message"].strip() else ""
    return int(match["index"]), match["type"], first_line


class IndexedDataset(Dataset):
    """Passes every item through; an item that raises becomes a SampleFailure naming its index."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: Any) -> Any:
        try:
            return self.inner[index]
        except Exception as error:
            raise sample_failure(index, error) from error

    def __getattr__(self, name: str) -> Any:
        # Code in workers may reach the dataset through get_worker_info().dataset: keep its attributes.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class IndexedBatchDataset(IndexedDataset):
    """An IndexedDataset for datasets that load a whole batch at once with __getitems__."""

    def __getitems__(self, indices: list[Any]) -> Any:
        try:
            return self.inner.__getitems__(indices)
        except Exception:
            # Find the sample at fault so the report can name it; the others loaded fine.
            return [self[i] for i in indices]


def indexed(dataset: Any) -> IndexedDataset:
    """The wrapper that fits `dataset`."""
    return IndexedBatchDataset(dataset) if hasattr(dataset, "__getitems__") else IndexedDataset(dataset)
