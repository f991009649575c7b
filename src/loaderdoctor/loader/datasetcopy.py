"""own_copy(): the user's dataset for loading in this process, a copy whose attributes are its own, so that what
loading sets on it (a file opened on first use) does not reach the workers forked later from this process."""

from __future__ import annotations

import copy
import logging
from typing import Any

from torch.utils.data import Dataset

log = logging.getLogger("loaderdoctor")

# Datasets that wrap datasets (Subset, ConcatDataset, a user's wrapper) are copied down to this depth.
_MAX_DEPTH = 4


def own_copy(dataset: Any, _depth: int = 0) -> Any:
    """`dataset` copied shallowly, and so each dataset it holds (an attribute, or a list or tuple of them): the
    data (arrays, tensors, lists of paths) stays shared, but a handle that loading opens lazily and sets on
    the copy is the copy's. `dataset` itself where it cannot be copied.

    Why: check, tune and verify measure several settings in one process. A settings that loads in this process
    (num_workers=0, threads) opens a lazily opened file on the user's object; every worker forked after that
    inherits it open and skips the start-up each worker of the user's own loop pays (measured: a 3 s open per
    worker with non-persistent workers read as 38 batches/s, where the plain loop gets 7)."""
    try:
        copied = copy.copy(dataset)
    except Exception as error:  # a dataset that refuses copying is loaded as it is
        log.debug("dataset %s not copied: %s", type(dataset).__name__, error)
        return dataset
    state = getattr(copied, "__dict__", None)
    if copied is dataset or not isinstance(state, dict) or _depth >= _MAX_DEPTH:
        return copied
    for name, value in list(state.items()):
        if isinstance(value, Dataset):
            state[name] = own_copy(value, _depth + 1)
        elif type(value) in (list, tuple) and value and all(isinstance(v, Dataset) for v in value):
            state[name] = type(value)(own_copy(v, _depth + 1) for v in value)
    return copied
