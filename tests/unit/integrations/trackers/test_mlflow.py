"""MLflow, in a local file store read back with MlflowClient: a saved report's figures as metrics, its findings
as tags and a JSON artifact, its HTML page as an artifact; in a run of its own or in the user's active run; from
Python (loaderdoctor.log_to) and from `loaderdoctor report SAVED --log-to mlflow`."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest
from saved_reports import CHECK, CHECK_TITLE, SCALE

import loaderdoctor
from loaderdoctor.cli import main
from loaderdoctor.saved import read_report

mlflow = pytest.importorskip("mlflow")
# MLflow starts processes of its own (git, uname) for a run's tags: marked as a test that starts workers.
pytestmark = [pytest.mark.timeout(120), pytest.mark.workers]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A local file store of MLflow's (its maintenance mode let through), no run active before or after."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    yield mlflow.MlflowClient()
    while mlflow.active_run() is not None:
        mlflow.end_run()


def _only_run(client):
    (experiment,) = client.search_experiments()
    (run,) = client.search_runs([experiment.experiment_id])
    return run


def _artifact(run, path: str) -> str:
    """An artifact of a run, read where the file store keeps it."""
    return (Path(urlparse(run.info.artifact_uri).path) / path).read_text(encoding="utf-8")


def test_a_check_report_is_logged_to_a_run_of_its_own_and_reads_back(store):
    where = loaderdoctor.log_to(read_report(CHECK), "mlflow")
    run = _only_run(store)
    assert run.info.run_id in where and run.info.status == "FINISHED"
    assert run.info.run_name == "loaderdoctor check demo"
    assert run.data.metrics == {
        "loaderdoctor/train/batches_per_s": 7.461,
        "loaderdoctor/train/wait_fraction": 0.8474,  # measured anew from the saved recording (see saved_reports.py)
        "loaderdoctor/train/share_of_limit": 0.334,
        "loaderdoctor/train/verified_speedup": 4.295,
    }
    assert run.data.tags["loaderdoctor.check.findings"] == f"critical input-bound (train): {CHECK_TITLE}"
    assert run.data.tags["loaderdoctor.check.critical"] == "1"
    assert run.data.tags["loaderdoctor.check.target"] == "demo"
    assert json.loads(_artifact(run, "loaderdoctor/check-findings.json")) == [
        {"loader": "train", "rule": "input-bound", "severity": "critical", "title": CHECK_TITLE}
    ]
    page = _artifact(run, "loaderdoctor/check.html")
    assert page.startswith("<!DOCTYPE html>") and "input-bound" in page and len(page) > 10_000


def test_the_users_active_run_is_logged_to_and_left_active(store):
    with mlflow.start_run(run_name="my training") as mine:
        mlflow.log_metric("loss", 0.5)
        loaderdoctor.log_to(read_report(SCALE), "mlflow")
        assert mlflow.active_run().info.run_id == mine.info.run_id
    run = _only_run(store)
    assert run.info.run_name == "my training"
    assert run.data.metrics["loss"] == 0.5
    assert run.data.metrics["loaderdoctor/train/scaling_efficiency"] == 3.302
    assert "distributed-sampler" in run.data.tags["loaderdoctor.scale.findings"]
    assert "scaling" in _artifact(run, "loaderdoctor/scale.html").lower()


def test_an_experiment_is_chosen_by_its_option_and_an_unknown_option_is_refused(store):
    loaderdoctor.log_to(read_report(CHECK), "mlflow", experiment="loaders", run_name="nightly")
    experiment = store.get_experiment_by_name("loaders")
    (run,) = store.search_runs([experiment.experiment_id])
    assert run.info.run_name == "nightly"
    with pytest.raises(loaderdoctor.UsageError, match="mlflow takes no option 'project': it takes experiment"):
        loaderdoctor.log_to(read_report(CHECK), "mlflow", project="x")


def test_a_run_of_its_own_that_fails_while_logging_is_ended_as_failed(store, monkeypatch):
    def full(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(mlflow, "log_text", full)
    with pytest.raises(OSError, match="no space left"):
        loaderdoctor.log_to(read_report(CHECK), "mlflow")
    assert mlflow.active_run() is None
    assert _only_run(store).info.status == "FAILED"


def test_the_report_command_logs_a_saved_report(store, capsys):
    assert main(["report", str(CHECK), "--log-to", "mlflow"]) == 0
    run = _only_run(store)
    assert run.data.metrics["loaderdoctor/train/verified_speedup"] == 4.295
    assert f"logged to mlflow: MLflow run {run.info.run_id}" in capsys.readouterr().err
