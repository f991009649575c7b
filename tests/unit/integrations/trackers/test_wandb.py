"""Weights & Biases, offline, read back from the run's own .wandb file (records W&B's protobufs, in its log format)
and its files: a saved report's figures in the run's history and summary, its findings as a table, its HTML page
as an HTML file; in a run of its own (project "loaderdoctor", finished) or in the user's active run."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from saved_reports import CHECK, CHECK_TITLE, SCALE

import loaderdoctor
from loaderdoctor.saved import read_report

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402

# wandb.init starts W&B's service process (wandb-core), ended by wandb.teardown() after each test.
pytestmark = [pytest.mark.timeout(120), pytest.mark.workers]

FIGURES = {
    "loaderdoctor/train/batches_per_s": 7.461,
    "loaderdoctor/train/wait_fraction": 0.8474,  # measured anew from the saved recording (see saved_reports.py)
    "loaderdoctor/train/share_of_limit": 0.334,
    "loaderdoctor/train/verified_speedup": 4.295,
}


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, every file of it under tmp_path; its service ended after the test."""
    for variable, folder in [("WANDB_DIR", ""), ("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"),
                             ("WANDB_CONFIG_DIR", "config"), ("WANDB_ARTIFACT_DIR", "artifacts")]:  # fmt: skip
        (tmp_path / folder).mkdir(exist_ok=True)
        monkeypatch.setenv(variable, str(tmp_path / folder))
    for variable, value in [("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_CONSOLE", "off"),
                            ("WANDB_DISABLE_GIT", "true"), ("WANDB_DISABLE_CODE", "true")]:  # fmt: skip
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    yield tmp_path
    if wandb.run is not None:
        wandb.run.finish()
    wandb.teardown()


def _records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    """The records of a .wandb file: a 7-byte header (":W&B", magic, version), then LevelDB's log format: blocks of
    32 KiB holding chunks (crc32, length, type: full, first, middle, last), a block's tail under 7 bytes zeros."""
    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    position, pieces = 7, b""
    while position + 7 <= len(raw):
        left = 32768 - position % 32768
        if left < 7:
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[position : position + 7])
        position += 7
        if kind == 0:
            break
        pieces += raw[position : position + length]
        position += length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def _read_run(root: Path) -> tuple[wandb_internal_pb2.RunRecord, dict, dict, Path]:
    """The only offline run under `root`: its run record, what its history logged and its summary's last values
    (by key, JSON-decoded; a media's nested keys joined by '.'), and its files folder. W&B's service is ended
    first: a finished run's file may hold only its header until the service closes it."""
    wandb.teardown()
    (path,) = root.glob("wandb/offline-run-*/run-*.wandb")
    run, history, summary = None, {}, {}
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            for item in record.history.item:
                history[item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "summary":
            for item in record.summary.update:
                summary[item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
    assert run is not None
    return run, history, summary, path.parent / "files"


def test_a_check_report_is_logged_to_an_offline_run_of_its_own_and_reads_back(offline):
    where = loaderdoctor.log_to(read_report(CHECK), "wandb")
    assert wandb.run is None  # the run it started is finished
    run, history, summary, files = _read_run(offline)
    assert run.project == "loaderdoctor" and run.job_type == "loaderdoctor-check" and run.run_id in where
    assert {key: history[key] for key in FIGURES} == FIGURES
    assert {key: summary[key] for key in FIGURES} == FIGURES

    table = json.loads((files / history["loaderdoctor/check_findings.path"]).read_text())
    assert table["columns"] == ["loader", "rule", "severity", "title"]
    assert table["data"] == [["train", "input-bound", "critical", CHECK_TITLE]]
    assert history["loaderdoctor/check_report._type"] == "html-file"
    page = (files / history["loaderdoctor/check_report.path"]).read_text()
    assert page.startswith("<!DOCTYPE html>") and "input-bound" in page and len(page) > 10_000


def test_the_users_active_run_is_logged_to_at_its_next_step_and_left_running(offline):
    mine = wandb.init(project="my-project", name="training")
    mine.log({"loss": 0.5})
    loaderdoctor.log_to(read_report(SCALE), "wandb", project="ignored while a run is active")
    assert wandb.run is mine
    mine.log({"loss": 0.25})
    mine.finish()
    run, history, summary, files = _read_run(offline)
    assert run.project == "my-project" and run.display_name == "training"
    assert history["loaderdoctor/train/scaling_efficiency"] == 3.302
    assert history["loss"] == 0.25 and history["_step"] == 1  # logged with the user's step 1, not a step of its own
    assert summary["loaderdoctor/train/samples_per_s"] == 361.999
    table = json.loads((files / history["loaderdoctor/scale_findings.path"]).read_text())
    assert [row[1] for row in table["data"]] == ["distributed-sampler", "input-bound"]
