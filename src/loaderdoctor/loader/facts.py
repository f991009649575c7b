"""What a user's loader is, beyond what it delivers (LoaderFacts): its lengths, its dataset, and how its sampler
splits the samples between ranks; read once by the probe, the watch and scale alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

# Indices of one epoch kept (scale compares the ranks' samples with them).
MAX_INDICES = 200_000
# Indices (or fingerprints of samples) a watched loader drew in its first epoch, kept at most: what run compares
# between ranks. Fewer than scale's: every rank's report carries them in run's JSON.
MAX_DRAWN = 10_000


def length_or_none(obj: Any, *, any_error: bool = False) -> int | None:
    """len(obj), or None when it has no length: a stream, a sampler or dataset without __len__ (TypeError), or one
    whose __len__ says it has none (NotImplementedError); with `any_error`, whatever its __len__ raises (where
    the length only explains something else)."""
    try:
        return len(obj)
    except (TypeError, NotImplementedError):
        return None
    except Exception:
        if any_error:
            return None
        raise


@dataclass
class LoaderFacts:
    """What one loader is: its batch size and lengths, its dataset, and the sampler that picks its indices."""

    batch_size: int | None = None
    batches_per_epoch: int | None = None  # len(loader): the steps taken per epoch (on each rank)
    iterable: bool = False
    dataset: str = ""  # the dataset's class
    dataset_len: int | None = None
    loader_class: str = ""  # the loader's class, module and name, when it is not torch's DataLoader itself
    drop_last: bool | None = None  # the DataLoader's: the last partial batch dropped
    sampler: str = ""  # the class of the sampler that picks the indices ("DistributedSampler", "RandomSampler")
    distributed: bool = False  # whether that sampler splits the indices between ranks (knows num_replicas and rank)
    sampler_drop_last: bool | None = None  # its DistributedSampler's drop_last; None without one
    samples_per_epoch: int | None = None  # len() of that sampler: the indices it gives one rank in an epoch
    # The dataset indices the sampler gives in one epoch (map-style; at most MAX_INDICES), and the fingerprints of
    # the first samples delivered (see tap/fingerprints.py): what scale compares between ranks.
    indices: list[int] | None = None
    fingerprints: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderFacts:
        """The LoaderFacts whose dataclasses.asdict() is `data`."""
        return cls(**data)


def loader_facts(loader: DataLoader, *, indices: bool = False) -> LoaderFacts:
    """The facts of `loader`; with `indices`, the indices of one epoch drawn from its sampler too (which takes a
    seed from the global generator, as an epoch would)."""
    dataset = loader.dataset
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(loader, "sampler", None)
    picker = batch_sampler if batch_sampler is not None else sampler
    inner = getattr(picker, "sampler", picker)  # a BatchSampler's sampler picks the indices
    iterable = isinstance(dataset, IterableDataset)
    distributed = isinstance(inner, DistributedSampler) or (hasattr(inner, "num_replicas") and hasattr(inner, "rank"))
    return LoaderFacts(
        batch_size=batch_size_of(loader),
        batches_per_epoch=length_or_none(loader),
        iterable=iterable,
        dataset=type(dataset).__name__,
        dataset_len=length_or_none(dataset),
        loader_class=class_words(type(loader)),
        drop_last=getattr(loader, "drop_last", None),
        sampler=type(inner).__name__,
        distributed=distributed,
        sampler_drop_last=bool(sampler.drop_last) if isinstance(sampler, DistributedSampler) else None,
        # a batch sampler without a sampler of its own has a length in batches, not indices
        samples_per_epoch=None if inner is batch_sampler else length_or_none(inner, any_error=True),
        indices=_epoch_indices(picker) if indices and not iterable else None,
    )


def class_words(cls: type) -> str:
    """A loader's class as "module.Name" ("torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader"),
    "" for torch's DataLoader itself."""
    if cls is DataLoader:
        return ""
    return f"{cls.__module__}.{cls.__qualname__}"


def batch_size_of(loader: DataLoader) -> int | None:
    """The loader's batch size, else its batch sampler's when it was given one that says (accelerate's, which
    prepare() puts in every loader it makes, and most written by hand); None when neither says."""
    if loader.batch_size is not None:
        return loader.batch_size
    size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _epoch_indices(picker: Any) -> list[int] | None:
    """The dataset indices `picker` (a loader's batch sampler, else its sampler) gives in one epoch (at most
    MAX_INDICES), or None when they are not plain integers."""
    found: list[int] = []
    try:
        for item in picker:
            for index in item if isinstance(item, (list, tuple)) else [item]:
                if not isinstance(index, int):
                    return None
                found.append(index)
                if len(found) >= MAX_INDICES:
                    return found
    except Exception:  # a sampler that cannot be walked outside its loader: the fingerprints still compare
        return None
    return found
