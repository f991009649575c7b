"""LoaderDoctorCallback: watch() for a Lightning Trainer's fit, measuring its train and val loaders from the
trainer's batch hooks, without touching the loaders.

Where the time goes in Lightning's loops: a training batch is fetched between the end hook of the batch before
and its own start hook, and for the first epoch the trainer calls iter() (starting the workers) before
on_train_start, after the sanity check; later epochs call it just after on_train_epoch_start. Validation is
fetched the same way, its iter() called after the training batch that precedes it and before
on_validation_start. A validation run inside a training epoch is set aside from the training loader's wait."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.host.forkhazards import iterator_facts
from loaderdoctor.integrations.lightning.ceiling import install_ceiling
from loaderdoctor.integrations.lightning.log import log_fit_figures, log_stretch
from loaderdoctor.integrations.lightning.state import Fit, batch_count, dataloaders_of, facts_after_iter, moment
from loaderdoctor.integrations.trainer.ceiling import ceiling_option
from loaderdoctor.integrations.trainer.hooked import HookedLoader
from loaderdoctor.integrations.trainer.hooks import check_callback_options, measuring, print_report
from loaderdoctor.integrations.trainer.loadingerrors import raised_in_loading
from loaderdoctor.report import LoaderReport, Report
from loaderdoctor.tap.ceiling import CeilingMeasured
from loaderdoctor.watch.progress import epoch_line
from loaderdoctor.watch.rankceilings import job_ceiling_finding

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError as error:  # pragma: no cover - the `lightning` extra is not installed
    raise ImportError(
        "loaderdoctor.lightning needs Lightning 2.2 or later: pip install 'loaderdoctor[lightning]'"
    ) from error

log = logging.getLogger("loaderdoctor")

_measuring = measuring("_fit", "the fit")


class LoaderDoctorCallback(Callback):
    """Measures the train and val loaders of `Trainer.fit` as watch() does a loop's, with no change to them:
    a batch's wait runs from the end hook of the batch before (at an epoch's start, from the epoch's start, which
    holds the workers' start-up) to its start hook, its step from the start hook to the end hook; the workers'
    memory and CPU are sampled in the background.

    Every `log_every_n_steps` training batches (default: the trainer's log_every_n_steps) the trainer's loggers
    get `loaderdoctor/train_wait_fraction` and `loaderdoctor/train_batches_per_s` over those batches (with
    `cost_per_hour`, `loaderdoctor/train_wait_cost_per_hour` too), and at each validation run's end the same for
    `val`. At the fit's end (or when it raises) each loader's run is diagnosed with check's rules, printed on
    stderr, and kept in the history (unless `history` is False) under `name` (default: the LightningModule's
    class name) followed by "/train" or "/val". Under DDP every rank measures; rank 0 alone logs, prints and
    keeps; at the fit's end, rank 0 logs each loader's main figures over the whole fit too (`loaderdoctor/train/
    batches_per_s`, `.../wait_fraction`, `.../share_of_limit`). `reports` holds the last fit's diagnosis by run
    name.

    `ceiling` (True, or a number of steps; off by default) measures the fit's rate with its input taken away, as
    `loaderdoctor run --ceiling` does: for a few turns the train loader hands the training step the batch it got
    last, and the report puts that rate beside the real one. Those steps train on repeated batches: use it on a
    diagnostic run. Each epoch that has data-free steps is that much longer, so that the loader still delivers
    all its batches, once, in order. With `ceiling_only`, the fit ends once the turns are done, by SystemExit(0)
    (loaderdoctor.tap.ceiling.CeilingExit; in a notebook, CeilingMeasured: one line, no traceback), its diagnosis
    printed."""

    def __init__(
        self,
        name: str | None = None,
        *,
        cost_per_hour: float | None = None,
        history: bool = True,
        log_every_n_steps: int | None = None,
        ceiling: bool | int = False,
        ceiling_only: bool = False,
    ) -> None:
        check_callback_options("LoaderDoctorCallback", name, cost_per_hour)
        if log_every_n_steps is not None and (
            isinstance(log_every_n_steps, bool) or not isinstance(log_every_n_steps, int) or log_every_n_steps < 1
        ):
            raise UsageError(f"log_every_n_steps must be a whole number, 1 or more, not {log_every_n_steps!r}")
        self.ceiling = ceiling_option(ceiling, ceiling_only)
        self.ceiling_only = ceiling_only
        self.name = name
        self.cost_per_hour = cost_per_hour
        self.history = history
        self.log_every_n_steps = log_every_n_steps
        self.reports: dict[str, LoaderReport] = {}
        self._fit: Fit | None = None

    # The fit

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.reports = {}
        try:
            self._fit = Fit(self.name or type(pl_module).__name__, trainer)
            self._fit.log_every = self.log_every_n_steps or max(1, int(trainer.log_every_n_steps or 1))
        except Exception as error:  # the fit goes on unmeasured
            self._fit = None
            message = f"loaderdoctor cannot measure this fit: {type(error).__name__}: {error}"
            warnings.warn(message, LoaderDoctorWarning, stacklevel=2)

    @_measuring
    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        assert self._fit is not None
        self._fit.fit_start = (moment(), iterator_facts(0, None))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore(trainer)  # before the trainer's teardown resets the loader's iterator

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, together=True)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._failed(trainer, exception)
        self._finish(trainer, together=isinstance(exception, CeilingMeasured))  # every rank ends at that step

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._finish(trainer)  # a fit that ended without on_fit_end: its pollers stop here at the latest

    # Training batches

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._train_epoch_start(trainer)
        if self._fit is not None and self._fit.ceiling is not None:  # the turns go on (or end) measured or not
            self._fit.ceiling.epoch_started(trainer, measured=not self._fit.broken)

    @_measuring
    def _train_epoch_start(self, trainer: Trainer) -> None:
        fit = self._fit
        assert fit is not None
        train = self._loader(trainer, "train", trainer.train_dataloader, batch_count(trainer.num_training_batches))
        if train is None:
            return
        if train.epoch < 0:
            at, facts = fit.fit_start
            train.epoch_started(at, facts)
            if self.ceiling is not False:
                fit.ceiling = install_ceiling(trainer, train.loader, self.ceiling, stop_when_done=self.ceiling_only)
                if fit.ceiling is not None:
                    train.recorder.rec.ceiling = fit.ceiling.ceiling.turns.ceiling  # filled in as the turns go by
        else:
            train.epoch_started()

    @_measuring
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        fit = self._fit
        assert fit is not None
        train = fit.train
        fit.data_free = moment() if fit.ceiling is not None and fit.ceiling.stepped() else None
        if train is not None and fit.data_free is None:
            train.batch_started(batch)

    @_measuring
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        fit = self._fit
        assert fit is not None
        train = fit.train
        if train is None:
            return
        data_free, fit.data_free = fit.data_free, None
        if data_free is not None:
            train.data_free_step(data_free)  # no batch of the run's
        else:
            train.batch_ended()
        total = batch_count(trainer.num_training_batches)
        if total is not None and batch_idx + 1 >= total:
            train.epoch_ended()  # now, not at on_train_epoch_end: the validation that follows is not the epoch's
        if data_free is not None:
            return
        fit.steps_since_log += 1
        if fit.steps_since_log >= fit.log_every:
            fit.steps_since_log = 0
            if fit.main:
                log_stretch(trainer, "train", train, self.cost_per_hour)

    @_measuring
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        assert self._fit is not None
        train = self._fit.train
        if train is None:
            return
        train.epoch_ended()
        progress = train.epoch_progress(trainer.max_epochs if trainer.max_epochs != -1 else None, self.cost_per_hour)
        if progress is not None and self._fit.main:
            log.info("%s", epoch_line(progress, train.recorder.rec.epochs[-1].wall_s))

    # Validation batches

    @_measuring
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        fit = self._fit
        assert fit is not None
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        train = fit.train
        # The validation's iter() ran after the last training batch's end hook: from there the time is its own.
        fit.val_from = train.idle_since if train is not None and not train.in_step else moment()
        fit.val_facts = facts_after_iter()
        fit.val_key = None
        if train is not None:
            train.pause(fit.val_from)

    @_measuring
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        fit = self._fit
        assert fit is not None
        loaders = dataloaders_of(trainer.val_dataloaders)
        key = "val" if len(loaders) <= 1 else f"val_{dataloader_idx}"
        if trainer.sanity_checking:
            # Not measured, but its workers are the val loader's: persistent ones serve the fit's validation.
            if batch_idx == 0 and dataloader_idx < len(loaders):
                fit.census.claim(key, [loaders[dataloader_idx]])
            return
        if fit.val_from is None:
            return
        if key != fit.val_key:
            previous = fit.loaders.get(fit.val_key) if fit.val_key is not None else None
            started = fit.val_from
            if previous is not None:
                previous.epoch_ended()
                started = previous.idle_since  # loaders validate one after the other
            fit.val_key = key
            loader = loaders[dataloader_idx] if dataloader_idx < len(loaders) else None
            batches = trainer.num_val_batches
            count = batches[dataloader_idx] if isinstance(batches, list) and dataloader_idx < len(batches) else None
            hooked = self._loader(trainer, key, loader, batch_count(count))
            if hooked is None:
                return
            hooked.epoch_started(started, fit.val_facts)
            hooked.start_stretch(started[0])  # a validation run's figures are its own
        hooked = fit.loaders.get(key)
        if hooked is not None:
            hooked.batch_started(batch)

    @_measuring
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        fit = self._fit
        assert fit is not None
        if trainer.sanity_checking or fit.val_key is None:
            return
        hooked = fit.loaders.get(fit.val_key)
        if hooked is not None:
            hooked.batch_ended()

    @_measuring
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        fit = self._fit
        assert fit is not None
        if trainer.sanity_checking or fit.val_from is None:
            return
        for key, hooked in fit.loaders.items():
            if key.startswith("val") and hooked.epoch >= 0:
                hooked.epoch_ended()
                if fit.main:
                    log_stretch(trainer, key, hooked, self.cost_per_hour)

    @_measuring
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        fit = self._fit
        assert fit is not None
        if trainer.sanity_checking or fit.val_from is None:
            return
        fit.val_from = fit.val_key = None
        if fit.train is not None:
            fit.train.resume()

    # Inside

    def _loader(self, trainer: Trainer, key: str, iterables: Any, batches_per_epoch: int | None) -> HookedLoader | None:
        """The HookedLoader of `key`, made at its first epoch; None for what cannot be measured."""
        fit = self._fit
        assert fit is not None
        if key in fit.loaders:
            return fit.loaders[key]
        if key in fit.skipped:
            return None
        loaders = dataloaders_of(iterables)
        if not loaders or not all(isinstance(loader, DataLoader) for loader in loaders):
            fit.skipped.add(key)
            kinds = ", ".join(sorted({type(loader).__name__ for loader in loaders})) or "nothing"
            warnings.warn(
                f"loaderdoctor measures torch DataLoaders; the fit's {key} loader is {kinds}: not measured",
                LoaderDoctorWarning,
                stacklevel=3,
            )
            return None
        census = fit.census
        hooked = HookedLoader(
            f"{fit.base}/{key}",
            loaders,
            batches_per_epoch=batches_per_epoch,
            workers=lambda: census.claim(key, loaders),
        )
        fit.loaders[key] = hooked
        return hooked

    @_measuring
    def _failed(self, trainer: Trainer, exception: BaseException) -> None:
        """An error raised while loading (not Ctrl-C, not the step's) ends the wait of the loader it came from."""
        fit = self._fit
        assert fit is not None
        if not isinstance(exception, Exception) or trainer.sanity_checking or not raised_in_loading(exception):
            return
        if fit.val_from is None:
            waiting = fit.train
        else:  # during validation: its loader, once its first batch said which (else the error is left unplaced)
            waiting = fit.loaders.get(fit.val_key) if fit.val_key is not None else None
        if waiting is not None:
            waiting.failed(exception)

    def _finish(self, trainer: Trainer, *, together: bool = False) -> None:
        """Diagnose every loader's run; on rank 0 print the diagnosis on stderr and keep the runs. Never raises.
        `together`: every rank of the fit reaches this call (the fit's end, the ceiling's exit), where, with a
        ceiling asked for, each hands rank 0 its ceiling and rank 0 has the job's (watch/rankceilings.py)."""
        self._restore(trainer)
        fit = self._fit
        ceiling = fit.ceiling if fit is not None and not fit.broken else None
        turns = ceiling.ceiling.turns.ceiling if ceiling is not None else None
        job = None
        if together and self.ceiling is not False and (fit is None or not fit.finished):
            job = job_ceiling_finding(turns, main=fit is not None and fit.main)
        if fit is None or fit.finished:
            return
        fit.finished = True
        if fit.broken:  # what was recorded may be inconsistent: no diagnosis, only the pollers stopped
            for hooked in fit.loaders.values():
                hooked.poller.stop()
            return
        reports: dict[str, LoaderReport] = {}
        for hooked in fit.loaders.values():
            try:
                measured = job is not None and hooked.recorder.rec.ceiling is turns  # the loader of the turns
                report = hooked.finish(history=self.history, main=fit.main, job=job if measured else None)
            except Exception as error:  # a diagnosis is not worth the training run's end
                warnings.warn(
                    f"loaderdoctor could not diagnose '{hooked.name}': {type(error).__name__}: {error}",
                    LoaderDoctorWarning,
                    stacklevel=2,
                )
                continue
            if report is not None:
                reports[hooked.name] = report
        self.reports = reports
        if reports and fit.main:
            print_report(Report(f"{fit.base} (Lightning fit)", reports))
            log_fit_figures(trainer, fit.base, {key: h.name for key, h in fit.loaders.items()}, reports)

    def _restore(self, trainer: Trainer) -> None:
        """The fit's train loader as the user gave it, its turns done or not. Never raises."""
        if self._fit is not None and self._fit.ceiling is not None:
            self._fit.ceiling.restore(trainer)
