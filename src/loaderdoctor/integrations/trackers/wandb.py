"""Weights & Biases: a report's figures in the run's history and summary, its findings as a table and its HTML
page as an HTML panel, in the active run (wandb.run) or in one started for it and finished."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from loaderdoctor.integrations.trackers.summary import Summary
from loaderdoctor.integrations.trackers.tracker import METRIC_PREFIX, require

DEFAULT_PROJECT = "loaderdoctor"
FINDING_COLUMNS = ("loader", "rule", "severity", "title")


class WandbTracker:
    """Logs to the active W&B run; with none, to a run started in `project` (default: $WANDB_PROJECT, else
    "loaderdoctor") with `init_options` (wandb.init's: entity, name, tags, mode...) and finished after."""

    name = "wandb"

    def __init__(self, *, project: str | None = None, **init_options: Any) -> None:
        self.project = project
        self.init_options = init_options

    def log(self, summary: Summary, page: str) -> str:
        wandb = require("wandb", self.name)
        run = wandb.run
        started = run is None
        if started:
            project = self.project or (None if os.environ.get("WANDB_PROJECT") else DEFAULT_PROJECT)
            run = wandb.init(**{"project": project, "job_type": f"loaderdoctor-{summary.kind}", **self.init_options})
        try:
            figures = {METRIC_PREFIX + key: value for key, value in summary.figures.items()}
            table = wandb.Table(
                columns=list(FINDING_COLUMNS),
                data=[[f[column] for column in FINDING_COLUMNS] for f in summary.findings],
            )
            media = {
                f"{METRIC_PREFIX}{summary.kind}_findings": table,
                f"{METRIC_PREFIX}{summary.kind}_report": wandb.Html(page, inject=False),
            }
            # In the user's run, at the step it logs next: its own step count goes on as it was.
            run.log({**figures, **media}, commit=started)
            run.summary.update(figures)
            where = run.url if not run.offline else f"W&B run {run.id} (offline, in {Path(run.dir).parent})"
        except BaseException:
            if started:
                run.finish(exit_code=1)
            raise
        if started:
            run.finish()
        return where or f"W&B run {run.id}"
