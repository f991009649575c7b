"""LoaderDoctorTrainerCallback: watch() for a Hugging Face Trainer's training, measuring its train loader from the
Trainer's step hooks, without touching the loader.

Where the time goes in the Trainer's loop (transformers 5): at each epoch it calls on_epoch_begin, then iter() of
the loader (accelerate's DataLoaderShard, which iterates the DataLoader it wraps one batch ahead); for each
optimizer step it fetches the step's batches (gradient_accumulation_steps of them) in one go, then calls
on_step_begin, steps on each batch (on_substep_end after each but the last) and calls on_step_end. A step's wait
runs from the end hook of the step before (or from the epoch's start) to its start hook, its batches share it
evenly (HookedLoader.batches_stepped). What follows a step's end hook before the next fetch (logging, evaluation,
saving a checkpoint: on_log, on_evaluate, on_save at their ends) is set aside: neither the step nor a wait.

With `ceiling=`, the data-free turns (tap/ceiling.py) go through accelerate's loader: its `base_dataloader`, which
its __iter__ iterates each epoch, is a TurnsLoader for the training (integrations/trainer/ceiling.py), the user's loader
again at its end; where accelerate dispatches the batches from the main process (an IterableDataset's loader),
the dispatcher's own epochs go through the turns, on every process (integrations/accelerate.py). The Trainer sets an
epoch's number of batches from the loader's length before any callback is called: an epoch with data-free steps
trains on as many fewer of its real batches (its last ones). In a distributed run each process hands the main one
its ceiling as the training ends, and the main one's report has the job's (watch/rankceilings.py)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from loaderdoctor.errors import LoaderDoctorWarning
from loaderdoctor.integrations.accelerate import DispatcherTurns, dispatched_batches
from loaderdoctor.integrations.trainer.ceiling import TrainerCeiling, TurnsLoader, ceiling_option
from loaderdoctor.integrations.trainer.census import WorkerCensus
from loaderdoctor.integrations.trainer.hooked import HookedLoader, Moment
from loaderdoctor.integrations.trainer.hooks import check_callback_options, measuring, print_report
from loaderdoctor.loader.facts import length_or_none
from loaderdoctor.report import LoaderReport, Report
from loaderdoctor.rules.finding import Finding
from loaderdoctor.watch.progress import epoch_line
from loaderdoctor.watch.rankceilings import job_ceiling_finding

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
        self.ceiling: TrainerCeiling | None = None  # the train loader's data-free turns (ceiling=...)
        self.undo: Callable[[], None] | None = None  # puts accelerate's loader back as it was, while turned

    def restore(self) -> None:
        """Accelerate's loader iterates as it did (its turns done or not)."""
        if self.undo is not None:
            undo, self.undo = self.undo, None
            undo()


class LoaderDoctorTrainerCallback(TrainerCallback):
    """Measures the train loader of `Trainer.train` as watch() does a loop's, with no change to it: a step's wait
    runs from the end hook of the step before (at an epoch's start, from the epoch's start, which holds the
    workers' start-up) to its start hook, and its steps from there to its end hook; with gradient accumulation the
    step's batches share both evenly. Logging, evaluation and checkpoints between steps are set aside. The
    workers' memory and CPU are sampled in the background.

    At the end of training the run is diagnosed with check's rules, printed on stderr, and kept in the history
    (unless `history` is False) under `name` (default: the model's class name) followed by "/train". In a
    distributed run every process measures; the main one alone prints and keeps. `reports` holds the last
    training's diagnosis by run name. A train() that raises is not diagnosed here (`loaderdoctor run` does it).

    `ceiling` (True, or a number of steps; off by default) measures the training's rate with its input taken away,
    as `loaderdoctor run --ceiling` does: for a few turns the train loader hands the step the batch it got last,
    and the report puts that rate beside the real one. Those steps train on repeated batches, and take the place
    of as many of their epoch's last real batches (the Trainer counts an epoch's batches before it starts): use it
    on a diagnostic run. With `ceiling_only`, train() ends once the turns are done, by SystemExit(0)
    (loaderdoctor.tap.ceiling.CeilingExit; in a notebook, CeilingMeasured: one line, no traceback), its diagnosis
    printed."""

    def __init__(
        self,
        name: str | None = None,
        *,
        cost_per_hour: float | None = None,
        history: bool = True,
        ceiling: bool | int = False,
        ceiling_only: bool = False,
    ) -> None:
        check_callback_options("LoaderDoctorTrainerCallback", name, cost_per_hour)
        self.ceiling = ceiling_option(ceiling, ceiling_only)
        self.ceiling_only = ceiling_only
        self.name = name
        self.cost_per_hour = cost_per_hour
        self.history = history
        self.reports: dict[str, LoaderReport] = {}
        self._run: _Training | None = None
        self._ranks_met = False  # whether this train()'s processes handed each other their ceilings

    # The training

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._stop_sampling()  # a train() before that raised: its run was left unfinished
        self.reports = {}
        self._run = None
        self._ranks_met = False
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
        count = run.batches + 1
        data_free = run.ceiling.stepped(count) if run.ceiling is not None else 0
        run.hooked.batches_stepped(count - data_free, run.step_from, data_free=data_free)
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
        if run.ceiling is not None:
            run.ceiling.epoch_ended()
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
        per_step = dispatched_batches(loader)  # accelerate's dispatcher: batches of `inner` in one of its own
        hooked = HookedLoader(
            name,
            [inner],
            batches_per_epoch=length_or_none(loader if per_step is not None else inner),
            workers=lambda: census.claim("train", [inner]),
            kind="huggingface",
        )
        run = _Training(hooked, main=bool(state.is_world_process_zero))
        if self.ceiling is not False:
            if inner is loader:
                warnings.warn(
                    "loaderdoctor cannot measure the ceiling: the Trainer's train loader is not accelerate's",
                    LoaderDoctorWarning,
                    stacklevel=3,
                )
            else:
                run.ceiling = self._turns(run, loader, inner, per_step)
                hooked.recorder.rec.ceiling = run.ceiling.turns.ceiling  # filled in as the turns go by
                run.ceiling.turns.ceiling.kept_length = "the Hugging Face Trainer counted its epochs' batches first"
                if run.main:
                    log.warning(
                        "the ceiling's data-free steps train on repeated batches, and the Trainer "
                        "counted its epochs' batches already: they take the place of as many of their epoch's last "
                        "real batches (a diagnostic run; see the README)"
                    )
        return run

    def _turns(self, run: _Training, loader: Any, inner: DataLoader, per_step: int | None) -> TrainerCeiling:
        """The data-free turns of accelerate's `loader` over `inner`, installed: accelerate's __iter__ iterates a
        TurnsLoader; a dispatcher's own epochs go through the turns instead (integrations/accelerate.py)."""
        ceiling = TrainerCeiling(inner, self.ceiling, stop_when_done=self.ceiling_only, on_measured=self._finish,
                                 batches_per_delivery=per_step or 1)  # fmt: skip
        if per_step is None:
            loader.base_dataloader = TurnsLoader(inner, ceiling)
            run.undo = lambda: setattr(loader, "base_dataloader", inner)
        else:
            run.undo = DispatcherTurns(loader, ceiling).restore
        return ceiling

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
        if run is not None:
            run.restore()
        if run is not None and not run.finished:
            run.finished = True
            run.hooked.poller.stop()

    def _finish(self) -> None:
        """Diagnose the run; in the main process print the diagnosis on stderr and keep the run. Never raises."""
        run = self._run
        if run is not None:
            run.restore()
        job = self._meet_ranks()
        if run is None or run.finished:
            return
        if run.broken:  # what was recorded may be inconsistent: no diagnosis, only the poller stopped
            self._stop_sampling()
            return
        run.finished = True
        hooked = run.hooked
        try:
            report = hooked.finish(history=self.history, main=run.main, job=job)
        except Exception as error:  # a diagnosis is not worth the training run's end
            hooked.poller.stop()
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

    def _meet_ranks(self) -> Finding | None:
        """With a ceiling asked for, once per train() on every process of a distributed run (at the training's end,
        or the turns' end with ceiling_only): this process's ceiling handed to the main one, which has the job's
        from every process's (watch/rankceilings.py); None elsewhere."""
        if self.ceiling is False or self._ranks_met:
            return None
        self._ranks_met = True
        run = self._run
        ceiling = run.ceiling if run is not None and not run.broken else None
        turns = ceiling.turns.ceiling if ceiling is not None else None
        return job_ceiling_finding(turns, main=run is not None and run.main)


def _epochs(args: TrainingArguments) -> int | None:
    """The epochs the training runs for, when it runs by epochs (not by max_steps)."""
    if getattr(args, "max_steps", -1) and args.max_steps > 0:
        return None
    epochs = getattr(args, "num_train_epochs", None)
    return int(epochs) if isinstance(epochs, (int, float)) and epochs >= 1 and float(epochs).is_integer() else None
