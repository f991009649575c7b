"""What a saved state_dict must be (version, keys, values) for load_state_dict() to restore it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.plan import plan_generators

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

STATE_VERSION = 1  # of state_dict()'s format: load_state_dict() reads this one only
_STATE_KEYS = (
    "version",
    "dataset_length",
    "batch_size",
    "epoch",
    "position",
    "remaining",
    "generators",
    "seed_state",
    "restarts",
    "skipped",
    "samples_seen",
)


def dataset_length(loader: DataLoader) -> int | None:
    """The length of the loader's dataset, or None when it has none."""
    try:
        return len(loader.dataset)
    except TypeError:  # a map-style dataset without __len__, read through its own sampler
        return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _generator_state(values: Any, place: str, generator: torch.Generator) -> torch.Tensor:
    """`values` as a state for `generator`; a UsageError unless they are bytes of the length its state has."""
    size = generator.get_state().numel()
    if not isinstance(values, list) or len(values) != size or not all(_whole(v) and v < 256 for v in values):
        raise UsageError(f"the saved state of {place} is not a list of {size} bytes (ints from 0 to 255)")
    return torch.tensor(values, dtype=torch.uint8)


def _checked_batches(remaining: Any, *, batched: bool, length: int | None) -> list[Any]:
    """The saved batches not yet delivered; a UsageError unless they are indices (lists of indices when
    `batched`) within the dataset."""
    batches = remaining if isinstance(remaining, list) else None
    if batches is not None and batched:
        indices = [i for batch in batches if isinstance(batch, list) for i in batch]
        batches = batches if all(isinstance(batch, list) for batch in batches) else None
    else:
        indices = batches or []
    if batches is None or not all(_whole(i) and (length is None or i < length) for i in indices):
        shape = "lists of indices" if batched else "indices"
        raise UsageError(f"the state's remaining must be a list of {shape} within the dataset, or None")
    return batches


def checked_state(state: Any, loader: DataLoader) -> dict[str, Any]:
    """`state` when load_state_dict() can resume `loader` from it, with the generator states as tensors;
    otherwise a UsageError saying what differs or what is malformed."""
    hint = "load a state_dict() taken from a guarded loader built the same way (dataset, batch size, generators)"
    if not isinstance(state, dict):
        raise UsageError(f"load_state_dict() expects the dict that state_dict() returns, not {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise UsageError(
            f"the state is of version {state.get('version')!r}; this loaderdoctor reads version {STATE_VERSION}",
            hint=hint,
        )
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise UsageError(f"the state lacks {', '.join(missing)}", hint=hint)
    for key, now in (("dataset_length", dataset_length(loader)), ("batch_size", loader.batch_size)):
        if state[key] != now:
            raise UsageError(
                f"the state was saved from a loader with {key}={state[key]!r}; this one has {key}={now!r}", hint=hint
            )
    saved_places, places = sorted(state["generators"] or {}), sorted(plan_generators(loader))
    if saved_places != places:
        raise UsageError(
            f"the state holds the generators {saved_places or 'none'} (by where they sit on the loader); this "
            f"loader has {places or 'none'}",
            hint=hint,
        )
    if not all(_whole(state[key]) for key in ("epoch", "position", "restarts", "samples_seen")):
        raise UsageError("the state's epoch, position, restarts and samples_seen must be whole numbers, 0 or more")
    if not isinstance(state["skipped"], list) or not all(_whole(i) for i in state["skipped"]):
        raise UsageError("the state's skipped must be a list of indices")
    remaining = state["remaining"]
    if remaining is not None:
        remaining = _checked_batches(
            remaining, batched=loader.batch_sampler is not None, length=state["dataset_length"]
        )
    generators = plan_generators(loader)
    seed_source = loader.generator if loader.generator is not None else torch.default_generator
    seed_state = state["seed_state"]
    return {
        **state,
        "remaining": remaining,
        "generators": {
            place: _generator_state(state["generators"][place], place, generator)
            for place, generator in generators.items()
        },
        "seed_state": None
        if seed_state is None
        else _generator_state(seed_state, "the workers' seed generator", seed_source),
    }
