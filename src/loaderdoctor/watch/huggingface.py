"""LoaderDoctorTrainerCallback: watch() for a Hugging Face Trainer's training, measuring its train loader from the
Trainer's step hooks, without touching the loader.

Where the time goes in the Trainer's loop (transformers 5): at each epoch it calls on_epoch_begin, then iter() of
the loader (accelerate's DataLoaderShard, which iterates the DataLoader it wraps one batch ahead); for each
optimizer step it fetches the step's batches (gradient_accumulation_steps of them) in one go, then calls
on_step_begin, steps on each batch (on_substep_end after each but the last) and calls on_step_end. A step's wait
runs from the end hook of the step before (or from the epoch's start) to its start hook, its batches share it
evenly (HookedLoader.batches_stepped). What follows a step's end hook before the next fetch (logging, evaluation,
saving a checkpoint: on_log, on_evaluate, on_save at their ends) is set aside: neither the step nor a wait."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor.errors import LoaderDoctorWarning, UsageError
from loaderdoctor.loader.facts import length_or_none
from loaderdoctor.report import LoaderReport, Report
from loaderdoctor.watch.census import WorkerCensus
from loaderdoctor.watch.hooked import HookedLoader, Moment
from loaderdoctor.watch.progress import epoch_line
from loaderdoctor.watch.trainerhooks import measuring, print_report

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as error:  # pragma: no cover - the `huggingface` extra is not installed
    raise ImportError(
        "loaderdoctor.huggingface needs transformers 4.40 or later: pip install 'loaderdoctor[huggingface]'"
    ) from error

log = logging.getLogger("loaderdoctor")

_measuring = measuring("_run", "the training")


class _Training:
    """What one train() keeps: its loader's HookedLoader, where the step under way began, its batches so far."""

    def __init__(self, hooked: HookedLoader, main: bool) -> None:
        self.hooked = hooked
        self.main = main
        self.step_from: Moment | None = None  # the start hook of the step under way
        self.batches = 0  # the batches of that step stepped on so far (its substeps)
        self.aside_from: Moment | None = None  # since the last step's end hook, or the last time set aside
        self.broken = False
        self.finished = False


class LoaderDoctorTrainerCallback(TrainerCallback):
    """Measures the train loader of `Trainer.train` as watch() does a loop's, with no change to it: a step's wait
    runs from the end hook of the step before (at an epoch's start, from the epoch's start, which holds the
    workers' start-up) to its start hook, and its steps from there to its end hook; with gradient accumulation the
    step's batches share both evenly. Logging, evaluation and checkpoints between steps are set aside. The
    workers' memory and CPU are sampled in the background.

    At the end of training the run is diagnosed with check's rules, printed on stderr, and kept in the history
    (unless `history` is False) under `name` (default: the model's class name) followed by "/train". In a
    distributed run every process measures; the main one alone prints and keeps. `reports` holds the last
    training's diagnosis by run name. A train() that raises is not diagnosed here (`loaderdoctor run` does it)."""

    def __init__(self, name: str | None = None, *, cost_per_hour: float | None = None, history: bool = True) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise UsageError(f"LoaderDoctorTrainerCallback's name must be a non-empty string, not {name!r}")
        if cost_per_hour is not None and (
            isinstance(cost_per_hour, bool) or not isinstance(cost_per_hour, (int, float)) or cost_per_hour < 0
        ):
            raise UsageError(f"cost_per_hour must be a number, 0 or more, not {cost_per_hour!r}")
        self.name = name
        self.cost_per_hour = cost_per_hour
        self.history = history
        self.reports: dict[str, LoaderReport] = {}
        self._run: _Training | None = None

    # The training

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._stop_sampling()  # a train() before that raised: its run was left unfinished
        self.reports = {}
        self._run = None
        try:
            self._run = self._start(state, kwargs.get("train_dataloader"), kwargs.get("model"))
        except Exception as error:  # the training goes on unmeasured
            message = f"loaderdoctor cannot measure this training: {type(error).__name__}: {error}"
            warnings.warn(message, LoaderDoctorWarning, stacklevel=2)

    @_measuring
    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        assert self._run is not None
        self._run.hooked.epoch_started()
        self._run.step_from = self._run.aside_from = None

    @_measuring
    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        run = self._run
        assert run is not None
        run.step_from, run.batches = run.hooked.moment(), 0

    @_measuring
    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        assert self._run is not None
        self._run.batches += 1

    @_measuring
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        run = self._run
        assert run is not None
        if run.step_from is None:
            return
        run.hooked.batches_stepped(run.batches + 1, run.step_from)
        run.step_from = None
        run.aside_from = run.hooked.idle_since

    @_measuring
    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._set_aside()

    @_measuring
    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._set_aside()

    @_measuring
    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._set_aside()

    @_measuring
    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        run = self._run
        assert run is not None
        run.hooked.epoch_ended()
        run.aside_from = None  # what follows until the next epoch's start is no epoch's
        progress = run.hooked.epoch_progress(_epochs(args), self.cost_per_hour)
        if progress is not None and run.main:
            log.info("%s", epoch_line(progress, run.hooked.recorder.rec.epochs[-1].wall_s))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._finish()

    # Inside

    def _start(self, state: TrainerState, loader: Any, model: Any) -> _Training | None:
        """The measuring of this train() of `loader` (accelerate's DataLoaderShard: the DataLoader it wraps is
        measured); None for a loader that is no torch DataLoader."""
        inner = getattr(loader, "base_dataloader", loader)
        if not isinstance(inner, DataLoader):
            kind = type(inner).__name__ if inner is not None else "nothing"
            warnings.warn(
                f"loaderdoctor measures torch DataLoaders; the Trainer's train loader is {kind}: not measured",
                LoaderDoctorWarning,
                stacklevel=3,
            )
            return None
        census = WorkerCensus()
        name = f"{self.name or type(model).__name__}/train"
        hooked = HookedLoader(
            name,
            [inner],
            batches_per_epoch=length_or_none(inner),
            workers=lambda: census.claim("train", [inner]),
            kind="huggingface",
        )
        return _Training(hooked, main=bool(state.is_world_process_zero))

    def _set_aside(self) -> None:
        """The time since the last step's end (or the last time set aside) was the Trainer's own: not a wait."""
        run = self._run
        assert run is not None
        if run.aside_from is None or run.step_from is not None:
            return
        run.hooked.pause(run.aside_from)
        run.hooked.resume()
        run.aside_from = run.hooked.moment()

    def _stop_sampling(self) -> None:
        run = self._run
        if run is not None and not run.finished:
            run.finished = True
            run.hooked.sampler.stop()

    def _finish(self) -> None:
        """Diagnose the run; in the main process print the diagnosis on stderr and keep the run. Never raises."""
        run = self._run
        if run is None or run.finished:
            return
        if run.broken:  # what was recorded may be inconsistent: no diagnosis, only the sampler stopped
            self._stop_sampling()
            return
        run.finished = True
        hooked = run.hooked
        try:
            report = hooked.finish(history=self.history, main=run.main)
        except Exception as error:  # a diagnosis is not worth the training run's end
            hooked.sampler.stop()
            warnings.warn(
                f"loaderdoctor could not diagnose '{hooked.name}': {type(error).__name__}: {error}",
                LoaderDoctorWarning,
                stacklevel=2,
            )
            return
        if report is None:
            return
        self.reports = {hooked.name: report}
        if run.main:
            print_report(Report(f"{hooked.name.rsplit('/', 1)[0]} (Hugging Face Trainer)", self.reports))


def _epochs(args: TrainingArguments) -> int | None:
    """The epochs the training runs for, when it runs by epochs (not by max_steps)."""
    if getattr(args, "max_steps", -1) and args.max_steps > 0:
        return None
    epochs = getattr(args, "num_train_epochs", None)
    return int(epochs) if isinstance(epochs, (int, float)) and epochs >= 1 and float(epochs).is_integer() else None
