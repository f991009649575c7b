"""What a saved state_dict must be (version, keys, values) for load_state_dict() to restore it.

A map-style dataset's: "epoch" is the epoch the next batch belongs to. Mid-epoch ("epoch_started": true),
"position" counts its batches delivered, "generators" holds the state that each generator the plans are drawn
from (by where it sits on the loader, see batchplan.plan_generators) had when the epoch began drawing its batches,
and "global_generator" torch's global generator's state then: load_state_dict() draws the epoch again from
there up to the position, so the state stays small whatever the dataset's length (a CPU generator's state is
5056 ints from 0 to 255), and an endless sampler resumes too. Between epochs ("epoch_started": false)
"position" is 0, "generators" holds their states now and "global_generator" is None. "seed_state" holds the
state the workers' base seed is drawn from. Then the restart count, "skipped" and "samples_seen" (the
bad-sample budget), which go on counting after a resume.

An IterableDataset's has "dataset": "iterable" and no plan: "position" counts the epoch's batches delivered,
"worker_states" maps each worker id (as a string; "0" for loading in the main process) to its stream's
state_dict() right after its last batch delivered (None between epochs), "last_worker" names the stream
delivered last (the next batch comes from the one after it), and "num_workers" the workers the streams belong
to; the generators, the seed state and the restart count as above. It is JSON-ready when the dataset's own
states are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from loaderdoctor.errors import UsageError
from loaderdoctor.guard.batchplan import plan_generators
from loaderdoctor.guard.streams import stream_count
from loaderdoctor.loader.facts import length_or_none
from loaderdoctor.plain.words import plural

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

STATE_VERSION = 2  # of state_dict()'s format, both kinds: load_state_dict() reads this one only
ITERABLE = "iterable"  # the "dataset" of an IterableDataset's state; a map-style dataset's state has no "dataset"
_STATE_KEYS = (
    "version",
    "dataset_length",
    "batch_size",
    "epoch",
    "position",
    "epoch_started",
    "generators",
    "global_generator",
    "seed_state",
    "restarts",
    "skipped",
    "samples_seen",
)
_STREAM_STATE_KEYS = (
    "version",
    "dataset",
    "dataset_length",
    "batch_size",
    "num_workers",
    "epoch",
    "position",
    "last_worker",
    "worker_states",
    "generators",
    "seed_state",
    "restarts",
)
_HINT = "load a state_dict() taken from a guarded loader built the same way (dataset, batch size, generators)"


def dataset_length(loader: DataLoader) -> int | None:
    """The length of the loader's dataset, or None when it has none (a map-style dataset without __len__, read
    through its own sampler)."""
    return length_or_none(loader.dataset)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _generator_state(values: Any, place: str, generator: torch.Generator) -> torch.Tensor:
    """`values` as a state for `generator`; a UsageError unless they are bytes of the length its state has."""
    size = generator.get_state().numel()
    if not isinstance(values, list) or len(values) != size or not all(_whole(v) and v < 256 for v in values):
        raise UsageError(f"the saved state of {place} is not a list of {size} bytes (ints from 0 to 255)")
    return torch.tensor(values, dtype=torch.uint8)


def _checked_common(state: Any, loader: DataLoader, keys: tuple[str, ...]) -> None:
    """A UsageError unless `state` is a dict of this version with `keys`, from a loader with the same dataset
    length, batch size and generators."""
    if not isinstance(state, dict):
        raise UsageError(f"load_state_dict() expects the dict that state_dict() returns, not {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise UsageError(
            f"the state is of version {state.get('version')!r}; this loaderdoctor reads version {STATE_VERSION}",
            hint=_HINT,
        )
    missing = [key for key in keys if key not in state]
    if missing:
        raise UsageError(f"the state lacks {', '.join(missing)}", hint=_HINT)
    for key, now in (("dataset_length", dataset_length(loader)), ("batch_size", loader.batch_size)):
        if state[key] != now:
            raise UsageError(
                f"the state was saved from a loader with {key}={state[key]!r}; this one has {key}={now!r}", hint=_HINT
            )
    saved_places, places = sorted(state["generators"] or {}), sorted(plan_generators(loader))
    if saved_places != places:
        raise UsageError(
            f"the state holds the generators {saved_places or 'none'} (by where they sit on the loader); this "
            f"loader has {places or 'none'}",
            hint=_HINT,
        )


def _restored_generators(state: dict[str, Any], loader: DataLoader) -> dict[str, Any]:
    """The state's generator states as tensors, each checked against the generator it restores."""
    seed_source = loader.generator if loader.generator is not None else torch.default_generator
    seed_state, global_state = state["seed_state"], state.get("global_generator")
    return {
        "global_generator": None
        if global_state is None
        else _generator_state(global_state, "torch's global generator", torch.default_generator),
        "generators": {
            place: _generator_state(state["generators"][place], place, generator)
            for place, generator in plan_generators(loader).items()
        },
        "seed_state": None
        if seed_state is None
        else _generator_state(seed_state, "the workers' seed generator", seed_source),
    }


def checked_state(state: Any, loader: DataLoader) -> dict[str, Any]:
    """`state` when load_state_dict() can resume `loader` (over a map-style dataset) from it, with the generator
    states as tensors; otherwise a UsageError saying what differs or what is malformed."""
    if isinstance(state, dict) and state.get("dataset") == ITERABLE:
        raise UsageError(
            "the state was saved from a guarded loader over an IterableDataset; this loader's dataset is map-style",
            hint=_HINT,
        )
    _checked_common(state, loader, _STATE_KEYS)
    if not all(_whole(state[key]) for key in ("epoch", "position", "restarts", "samples_seen")):
        raise UsageError("the state's epoch, position, restarts and samples_seen must be whole numbers, 0 or more")
    if not isinstance(state["skipped"], list) or not all(_whole(i) for i in state["skipped"]):
        raise UsageError("the state's skipped must be a list of indices")
    started = state["epoch_started"]
    if not isinstance(started, bool):
        raise UsageError(f"the state's epoch_started must be true or false, not {started!r}")
    if started == (state["global_generator"] is None) or (not started and state["position"]):
        raise UsageError(
            "the state's epoch_started, position and global_generator disagree: an epoch under way has the global "
            "generator's state at its start, one not started has position 0 and none"
        )
    return {**state, **_restored_generators(state, loader)}


def checked_stream_state(state: Any, loader: DataLoader, num_workers: int) -> dict[str, Any]:
    """`state` when load_state_dict() can resume `loader` (over an IterableDataset, loading with `num_workers`)
    from it, with the generator states as tensors and "worker_states" keyed by int stream ids (None between
    epochs); otherwise a UsageError saying what differs or what is malformed.

    The states of the workers' streams map onto as many workers only: 0 and 1 are both one stream."""
    if isinstance(state, dict) and state.get("dataset") != ITERABLE:
        raise UsageError(
            "the state was saved from a guarded loader over a map-style dataset; this loader's dataset is an "
            "IterableDataset",
            hint=_HINT,
        )
    _checked_common(state, loader, _STREAM_STATE_KEYS)
    if not all(_whole(state[key]) for key in ("num_workers", "epoch", "position", "restarts")):
        raise UsageError("the state's num_workers, epoch, position and restarts must be whole numbers, 0 or more")
    saved_workers, states = state["num_workers"], state["worker_states"]
    streams = stream_count(saved_workers)
    last = state["last_worker"]
    if last is not None and not (_whole(last) and last < streams):
        raise UsageError(f"the state's last_worker must be None or a worker id below {streams}, not {last!r}")
    if states is None:
        return {**state, **_restored_generators(state, loader)}
    ids = list(states) if isinstance(states, dict) else None
    if ids is None or not all(isinstance(i, str) and i.isascii() and i.isdigit() and int(i) < streams for i in ids):
        raise UsageError(
            f"the state's worker_states must be a dict from worker ids below {streams} (as strings) to the dataset's "
            "states, or None"
        )
    if stream_count(num_workers) != streams:
        raise UsageError(
            f"the state holds {plural(streams, 'stream')}, saved with num_workers={saved_workers}; this loader has "
            f"num_workers={num_workers}: an IterableDataset's workers each iterate their own stream, whose saved "
            "states resume on as many workers only (0 and 1 are both one stream)",
            hint="build the loader with the num_workers the state was saved with",
        )
    return {**state, "worker_states": {int(i): s for i, s in states.items()}, **_restored_generators(state, loader)}
