"""TensorBoard: a saved report's figures as scalars and its findings as text in an event file, read back with
TensorBoard's own EventAccumulator, and its HTML page a file in the log folder; from Python and from
`loaderdoctor report SAVED --log-to tensorboard`."""

from __future__ import annotations

import pytest
from saved_reports import CHECK, CHECK_TITLE, TUNE

import loaderdoctor
from loaderdoctor.cli import main
from loaderdoctor.saved import read_report

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.timeout(120)


def _events(folder) -> EventAccumulator:
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def _text(events: EventAccumulator, tag: str) -> str:
    (event,) = events.Tensors(f"{tag}/text_summary")
    return event.tensor_proto.string_val[0].decode("utf-8")


def test_a_check_report_is_written_as_scalars_text_and_a_page(tmp_path):
    where = loaderdoctor.log_to(read_report(CHECK), "tensorboard", log_dir=tmp_path / "tb", step=7)
    assert str(tmp_path / "tb") in where
    events = _events(tmp_path / "tb")
    scalars = {tag: [(e.step, round(e.value, 4)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {
        "loaderdoctor/train/batches_per_s": [(7, 7.461)],
        "loaderdoctor/train/wait_fraction": [(7, 0.8474)],  # measured anew (see saved_reports.py)
        "loaderdoctor/train/share_of_limit": [(7, 0.334)],
        "loaderdoctor/train/verified_speedup": [(7, 4.295)],
    }
    findings = _text(events, "loaderdoctor/check_findings")
    assert findings == f"    critical input-bound (train): {CHECK_TITLE}"
    page = tmp_path / "tb" / "loaderdoctor-check.html"
    assert str(page) in _text(events, "loaderdoctor/check_report")
    assert "input-bound" in page.read_text() and page.stat().st_size > 10_000


def test_the_report_command_writes_to_runs_loaderdoctor_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(TUNE), "--log-to", "tensorboard"]) == 0
    folder = tmp_path / "runs" / "loaderdoctor"
    events = _events(folder)
    assert events.Scalars("loaderdoctor/train/tuned_batches_per_s")[0].value == pytest.approx(9.163)
    assert _text(events, "loaderdoctor/tune_findings") == "    no findings"
    assert (folder / "loaderdoctor-tune.html").is_file()
    assert "logged to tensorboard: TensorBoard events in runs/loaderdoctor" in capsys.readouterr().err


def test_a_log_folder_that_cannot_be_written_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(loaderdoctor.UsageError, match="cannot write to the TensorBoard folder"):
        loaderdoctor.log_to(read_report(CHECK), "tensorboard", log_dir=tmp_path / "file" / "tb")
