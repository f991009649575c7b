"""MLflow: a report's figures as metrics, its findings as tags and a JSON artifact, and its HTML page as an
artifact, in the active run (mlflow.active_run()) or in one started for it and ended."""

from __future__ import annotations

import json
from types import ModuleType

from loaderdoctor.integrations.trackers.summary import Summary, bounded
from loaderdoctor.integrations.trackers.tracker import METRIC_PREFIX, require

# MLflow keeps a tag's value to 8,000 characters.
MAX_TAG = 5000


class MlflowTracker:
    """Logs to the active MLflow run; with none, to a run started (named `run_name`, default "loaderdoctor KIND
    TARGET") in `experiment` (default: MLflow's own choice, $MLFLOW_EXPERIMENT_NAME or its default) and ended
    after. The tracking URI is MLflow's ($MLFLOW_TRACKING_URI)."""

    name = "mlflow"

    def __init__(self, *, experiment: str | None = None, run_name: str | None = None) -> None:
        self.experiment = experiment
        self.run_name = run_name

    def log(self, summary: Summary, page: str) -> str:
        mlflow = require("mlflow", self.name)
        started = mlflow.active_run() is None
        if started:
            experiment_id = None if self.experiment is None else _experiment_id(mlflow, self.experiment)
            run_name = self.run_name or f"loaderdoctor {summary.kind} {summary.target}"
            mlflow.start_run(experiment_id=experiment_id, run_name=run_name)
        try:
            run = mlflow.active_run()
            mlflow.log_metrics({METRIC_PREFIX + key: value for key, value in summary.figures.items()})
            prefix = f"loaderdoctor.{summary.kind}"
            mlflow.set_tags(
                {
                    f"{prefix}.target": summary.target,
                    f"{prefix}.findings": bounded(summary.findings_text(), MAX_TAG),
                    f"{prefix}.critical": str(sum(f["severity"] == "critical" for f in summary.findings)),
                }
            )
            mlflow.log_text(json.dumps(summary.findings, indent=2), f"loaderdoctor/{summary.kind}-findings.json")
            mlflow.log_text(page, f"loaderdoctor/{summary.kind}.html")
            where = f"MLflow run {run.info.run_id} ({mlflow.get_tracking_uri()})"
        except BaseException:
            if started:
                mlflow.end_run(status="FAILED")
            raise
        if started:
            mlflow.end_run()
        return where


def _experiment_id(mlflow: ModuleType, name: str) -> str:
    """The id of the experiment called `name`, made if there is none (the active experiment is left as it was)."""
    client = mlflow.MlflowClient()
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)
