"""The ceiling's data-free turns in a Lightning fit (LoaderDoctorCallback(ceiling=...)): the fit's combined train
loader holds a TurnsLoader in place of the user's DataLoader while the fit runs, and each epoch is lengthened by
the data-free batches it gets, so that the real loader still delivers all its batches of the epoch.

Lightning 2.6 calls the first epoch's iter() inside FitLoop.setup_data, with no hook between the combined loader's
making and that iter(): that epoch's iterator, already made, is put through the turns in place (the combined
loader's mode iterator holds it), later epochs' through the TurnsLoader. An epoch's length is set where Lightning
keeps it: the fit loop's max_batches (the trainer's num_training_batches), the combined loader's limits, the
data fetcher's length, and the validation's batch interval when it was the epoch's end. A fit whose schedule raises
past a fixed number of steps (a OneCycleLR sized for the fit) is not lengthened: there the data-free batches take the
place of as many of their epoch's last real ones, as in the Hugging Face Trainer, and a warning says so."""

from __future__ import annotations

import math
import warnings
from typing import Any

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.integrations.trainer.ceiling import TrainerCeiling, TurnsLoader
from loaderdoctor.tap.schedules import raising_schedule


class LightningCeiling:
    """The turns installed in one fit's combined train loader, with what they changed, to put back."""

    def __init__(self, trainer: Any, ceiling: TrainerCeiling, proxy: TurnsLoader) -> None:
        fit_loop = trainer.fit_loop
        self.ceiling = ceiling
        self.proxy = proxy
        self.combined = fit_loop._combined_loader
        self.flattened = list(self.combined.flattened)
        self.limits = self.combined.limits
        self.max_batches = fit_loop.max_batches
        self.val_check_batch = trainer.val_check_batch
        self.fixed_steps = fixed_step_budget(trainer)  # why the epochs must keep their length, or None
        self.restored = False

    def stepped(self) -> bool:
        """The trainer takes its next batch: whether it is a data-free one."""
        return self.ceiling.stepped(1) > 0

    def epoch_started(self, trainer: Any, *, measured: bool) -> None:
        """An epoch begins (on_train_epoch_start): it is lengthened by the data-free batches it will get; where the
        fit is no longer `measured`, the user's loader is put back instead. Never raises."""
        if self.restored:
            return
        if not measured:
            self.restore(trainer)
            return
        if math.isinf(self.max_batches) or self.fixed_steps is not None:
            return  # an epoch that runs until its loader ends (no count to lengthen), or one that must keep its count
        try:
            self._lengthen(trainer, int(self.max_batches))
        except Exception as error:
            warnings.warn(
                f"loaderdoctor stopped measuring the ceiling: {type(error).__name__}: {error}",
                LoaderDoctorWarning,
                stacklevel=2,
            )
            self.restore(trainer)

    def _lengthen(self, trainer: Any, real: int) -> None:
        """The epoch to come counts its `real` batches and the data-free ones among them, wherever Lightning counts."""
        extra = self.ceiling.data_free_ahead(real)
        self.proxy.extra = extra
        fit_loop = trainer.fit_loop
        limits = [limit + extra for limit in self.limits] if self.limits is not None else None
        self.combined.limits = limits
        iterator = self.combined._iterator
        if iterator is not None:
            iterator.limits = limits  # the first epoch's iterator, made already
        fit_loop.max_batches = real + extra
        fetcher = fit_loop._data_fetcher
        if fetcher is not None and fetcher.length is not None:
            fetcher.length = real + extra
        if self.val_check_batch == real:  # validation at the epoch's end stays there
            trainer.val_check_batch = real + extra

    def restore(self, trainer: Any) -> None:
        """The user's DataLoader back in the combined loader, and Lightning's counts as they were. Never raises."""
        if self.restored:
            return
        self.restored = True
        try:
            self.combined.flattened = self.flattened
            self.combined.limits = self.limits
            trainer.fit_loop.max_batches = self.max_batches
            trainer.val_check_batch = self.val_check_batch
        except Exception as error:
            warnings.warn(
                f"loaderdoctor could not put the fit's train loader back: {type(error).__name__}: {error}",
                LoaderDoctorWarning,
                stacklevel=2,
            )


def fixed_step_budget(trainer: Any) -> str | None:
    """Why the fit must take no step more than it planned, or None: one of its schedules raises once stepped past
    the steps it was sized for (tap/schedules.py), which a fit sizes from its epochs' batches."""
    for config in getattr(trainer, "lr_scheduler_configs", None) or []:
        found = raising_schedule(config.scheduler)
        if found is not None:
            return found
    return None


def install_ceiling(trainer: Any, loader: Any, steps: int | None, *, stop_when_done: bool) -> LightningCeiling | None:
    """The turns put into the fit's train loader `loader` at the first epoch's start (its iterator made, no batch
    taken yet); None, said as a warning, where the fit's loading is not what they can go through."""
    fit_loop = trainer.fit_loop
    combined = getattr(fit_loop, "_combined_loader", None)
    fetcher = getattr(fit_loop, "_data_fetcher", None)
    iterator = getattr(combined, "_iterator", None)
    why = None
    if combined is None or fetcher is None or iterator is None:
        why = "the fit's train loader is not made yet"
    elif len(combined.flattened) != 1 or combined.flattened[0] is not loader or len(iterator.iterators) != 1:
        why = "the fit has several train loaders"
    elif trainer.reload_dataloaders_every_n_epochs:
        why = "the fit reloads its train loader (reload_dataloaders_every_n_epochs)"
    elif fetcher.fetched > 1 or trainer.current_epoch != 0:
        why = "the fit resumes within its loading"
    if why is not None:
        warnings.warn(f"loaderdoctor cannot measure the ceiling: {why}", LoaderDoctorWarning, stacklevel=3)
        return None
    ceiling = TrainerCeiling(loader, steps, stop_when_done=stop_when_done)
    proxy = TurnsLoader(loader, ceiling)
    installed = LightningCeiling(trainer, ceiling, proxy)
    if installed.fixed_steps is not None:
        ceiling.turns.ceiling.kept_length = f"the fit's {installed.fixed_steps}"
        warnings.warn(
            f"loaderdoctor: the fit's epochs keep their length (its {installed.fixed_steps}): the ceiling's data-free "
            "steps take the place of as many of their epoch's last real batches",
            LoaderDoctorWarning,
            stacklevel=3,
        )
    iterator.iterators[0] = ceiling.iterator(iterator.iterators[0], fetched_before=fetcher.fetched)
    combined.flattened = [proxy]
    return installed
