"""GuardedLoader's state_dict() and load_state_dict(): where the loader stands, saved as plain data and resumed
from it (the format of each kind of dataset in state.py, its making and reading in resume.py). A base class of
GuardedLoader, split off by responsibility: it reads and sets the loader's own state, declared below."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loaderdoctor.guard.resume import Standing

if TYPE_CHECKING:
    import torch

    from loaderdoctor.guard.resume import Resume
    from loaderdoctor.loader.settings import Settings


class Checkpoints:
    """The saving and resuming half of GuardedLoader (see the module's docstring)."""

    settings: Settings
    restarts: int
    skipped: list[int]
    _samples_seen: int
    _resume: Resume
    _epoch: int
    _position: int
    _exhausted: bool
    _resume_pending: bool
    _seed_state: torch.Tensor | None

    def _end_epoch(self) -> None:
        raise NotImplementedError

    def _close_inner(self) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as plain JSON-ready data (a few kilobytes whatever the dataset's length),
        for load_state_dict() on a loader built the same way, whose next iter() then resumes at the first batch
        not yet delivered. The format of each kind is described in guard/state.py."""
        mid_epoch = self._epoch >= 0 and not self._exhausted and not self._resume.ends_at(self._position)
        standing = Standing(
            epoch=self._epoch if mid_epoch else self._epoch + 1,
            position=self._position,
            mid_epoch=mid_epoch,
            seed_state=self._seed_state,
            restarts=self.restarts,
            skipped=self.skipped,
            samples_seen=self._samples_seen,
        )
        return self._resume.state(standing, self.settings.num_workers)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iter() resume where `state` (from state_dict()) was taken: the batches not yet
        delivered, in their order, then the later epochs as the saved loader would have drawn them.

        Ends any epoch under way and its workers. A UsageError, changing nothing, when the state is of
        another version, malformed, or from a loader that differs (dataset length, batch size, generators;
        over an IterableDataset, mid-epoch, the number of workers: 0 and 1 are both one stream).
        """
        self._end_epoch()
        loaded = self._resume.load(state, self.settings.num_workers)
        self._close_inner()  # the next workers start from the loaded seed state (and streams)
        self._seed_state, self.restarts = loaded.seed_state, loaded.restarts
        if loaded.skipped is not None:
            self.skipped = list(loaded.skipped)
        if loaded.samples_seen is not None:
            self._samples_seen = loaded.samples_seen
        self._resume_pending = loaded.mid_epoch
        self._epoch = loaded.epoch if loaded.mid_epoch else loaded.epoch - 1
        self._position = loaded.position if loaded.mid_epoch else 0
        self._exhausted = not loaded.mid_epoch
