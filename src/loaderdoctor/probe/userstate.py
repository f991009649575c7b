"""user_state_kept(): the random states that running a user's loaders moves, saved first and restored after."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from loaderdoctor.guard.batchplan import plan_generators


@contextlib.contextmanager
def user_state_kept(loaders: Iterable[DataLoader]) -> Iterator[None]:
    """Restores, on the way out (errors too), the states of the generators that `loaders` draw their order from
    and of torch's, python's and numpy's global random states: loaders that check or tune built from the user's
    objects draw from them (iter() draws a base seed, a RandomSampler its permutation, a dataset's
    augmentations run in this process), and a loader checked before training must shuffle as it was seeded.
    States are restored rather than objects copied: a dataset may be huge, and a sampler may be shared."""
    generators = {id(g): g for loader in loaders for g in plan_generators(loader).values()}
    saved = [(generator, generator.get_state()) for generator in generators.values()]
    torch_state = torch.get_rng_state()
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    try:
        yield
    finally:
        for generator, state in saved:
            generator.set_state(state)
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
