"""The DataLoader's own attributes on the guarded loader (dataset, batch_size, collate_fn, num_workers, ...): read
from the user's loader and set on it as torch sets them, applied from the next iter() on."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

# Properties rather than __setattr__, which would cost every assignment of the guard's own state per batch.
LOADER_ATTRIBUTES = [name for name in vars(DataLoader([0])) if not name.startswith("_")] + ["multiprocessing_context"]


def _forwarded(name: str) -> property:
    """The DataLoader's attribute `name` on the guarded loader: read from the user's loader, and set on it as torch
    sets it (a ValueError for those torch fixes after construction: batch_size, sampler, dataset...); the others
    (collate_fn, num_workers, timeout...) apply from the next iter() on, as with torch's DataLoader."""

    def read(guarded: Any) -> Any:
        return getattr(guarded.loader, name)

    def write(guarded: Any, value: Any) -> None:
        setattr(guarded.loader, name, value)
        guarded._loader_changed = True

    return property(read, write, doc=f"The user's DataLoader's {name}.")


def forward_loader_attributes(cls: type) -> None:
    """Give the guarded loader's class a property for each of the DataLoader's attributes."""
    for name in LOADER_ATTRIBUTES:
        setattr(cls, name, _forwarded(name))
