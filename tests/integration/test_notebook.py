"""check() in a real Jupyter kernel (this venv's python, driven by nbclient): while it runs, one display in the cell
is updated with the phase and the time left of the budget; the report then renders inline as its HTML page in a
sandboxed iframe, its text/plain the short repr, and print() gives the console text; Ctrl-C leaves the partial
report in the exception's `report`."""

from __future__ import annotations

import json
import sys
from html.parser import HTMLParser
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = [pytest.mark.workers, pytest.mark.timeout(180)]

SETUP = """\
import time
import torch
from torch.utils.data import DataLoader, Dataset
import loaderdoctor

class Slow(Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        time.sleep(0.004)  # loading in the main process, far slower than the step: input-bound
        return torch.zeros(8)

loader = DataLoader(Slow(), batch_size=2, num_workers=0)
"""
# Ctrl-C as the kernel's interrupt gives it (SIGINT to the kernel's process), three seconds into a check.
STOPPED = """\
import os, signal, threading
threading.Timer(3, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    loaderdoctor.check({'nb_train': loader}, step_ms=1, budget_s=60, verify_fix=False)
except loaderdoctor.StoppedByUser as e:
    print(e)
    print(type(e.report).__name__, list(e.report.loaders), e.partial is e.report)
"""
CHECK = "report = loaderdoctor.check({'nb_train': loader}, step_ms=1, budget_s=3, verify_fix=False)"


class RecordingClient(nbclient.NotebookClient):
    """nbclient's client, keeping every message the kernel sent per cell (the outputs keep only the last state of
    an updated display)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.messages: dict[int, list[dict[str, Any]]] = {}

    def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        self.messages.setdefault(cell_index, []).append({"type": msg["msg_type"], "content": msg["content"]})
        return super().process_message(msg, cell, cell_index)


@pytest.fixture
def this_venvs_kernel(tmp_path, monkeypatch):
    """A kernel spec "python3" in a folder of the test's own, first on JUPYTER_PATH, running this very python;
    Jupyter's and IPython's runtime files in the test's folders too (nothing written to the user's)."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return "python3"


class _Frames(HTMLParser):
    """The iframes of an HTML fragment, by their attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "iframe":
            self.frames.append(dict(attrs))


def test_a_check_in_a_notebook_shows_progress_then_its_report_inline(this_venvs_kernel, tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(CHECK),
        nbformat.v4.new_code_cell("report"),
        nbformat.v4.new_code_cell("print(report)"),
        nbformat.v4.new_code_cell(STOPPED),
    ]
    client = RecordingClient(notebook, kernel_name=this_venvs_kernel, timeout=150, resources={"metadata": {}})
    client.execute(cwd=str(tmp_path))
    setup, checked, shown, printed, stopped = (cell.outputs for cell in notebook.cells)
    assert [o for o in setup if o.output_type == "error"] == []

    # Progress: one display, updated in place (not a line per update), with the phase and the time left.
    kinds = [m["type"] for m in client.messages[1]]
    assert kinds.count("display_data") == 1 and kinds.count("update_display_data") >= 2
    updates = [m["content"]["data"]["text/plain"] for m in client.messages[1] if m["type"] == "update_display_data"]
    assert any("measuring 'nb_train': epoch" in line and "left of the 3 s budget" in line for line in updates)
    (display,) = checked  # all that stays in the cell: the display in its last state
    assert display.output_type == "display_data"
    assert display.data["text/plain"].startswith("loaderdoctor check: done in")
    assert "measuring 'nb_train'" in display.data["text/plain"]  # what it did last

    # The report inline: its page in a sandboxed iframe (loader and finding inside), its text/plain the short repr.
    (result,) = shown
    assert result.output_type == "execute_result"
    parser = _Frames()
    parser.feed(result.data["text/html"])
    (frame,) = parser.frames
    assert frame["sandbox"] == "" and frame["srcdoc"].startswith("<!DOCTYPE html>")
    assert "Content-Security-Policy" in frame["srcdoc"] and "nb_train" in frame["srcdoc"]
    assert "waits for data" in frame["srcdoc"]  # the input-bound finding's title
    plain = result.data["text/plain"]
    assert plain.startswith("<loaderdoctor check of") and "'nb_train': critical input-bound" in plain
    assert len(plain.splitlines()) <= 4

    # print(report): the console text, as loaderdoctor.show prints it.
    text = "".join(o.get("text", "") for o in printed if o.output_type == "stream")
    assert "loaderdoctor check" in text and "loader 'nb_train'" in text and "input-bound" in text

    # Ctrl-C: StoppedByUser says what was stopped and where the partial report is; the display says it stopped.
    (display, *streams) = stopped
    assert display.data["text/plain"].startswith("loaderdoctor check: stopped after")
    text = "".join(o.get("text", "") for o in streams if o.output_type == "stream")
    assert "check of '<loaders>' stopped before the end ('nb_train' measured)" in text and "e.report" in text
    assert "Report ['nb_train'] True" in text


WATCHED = """\
loader = DataLoader(Slow(), batch_size=2, num_workers=1)
with loaderdoctor.watch(loader, "nb_watch", history=False, log_every_s=3600, ceiling=15) as watched:
    for step, batch in enumerate(watched):
        time.sleep(0.001)
        if step == 150:
            break
watched.report.recording.ceiling.data_free_steps, watched.report.recording.ceiling.complete
"""
CEILING_ONLY = """\
steps = 0
with loaderdoctor.watch(loader, "nb_only", history=False, log_every_s=3600, ceiling=15, ceiling_only=True) as w:
    for batch in w:
        steps += 1
print("never printed: the loop was ended")
"""


def test_a_watch_in_a_notebook_measures_its_ceiling_shows_its_report_and_ends_cleanly(this_venvs_kernel, tmp_path):
    """watch(ceiling=...) in a notebook's cell: the turns run in the user's own loop; the report a watch returns
    shows as check's does (short text, its page inline), not as every batch's dataclass; ceiling_only ends the
    cell with one line, not IPython's 'An exception has occurred' and hint to quit, and the next cell runs."""
    notebook = nbformat.v4.new_notebook()
    cells = [SETUP, WATCHED, "watched.report", "print(watched.report)", CEILING_ONLY, "print('next cell', steps)"]
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = nbclient.NotebookClient(notebook, kernel_name=this_venvs_kernel, timeout=150, allow_errors=True,
                                     resources={"metadata": {}})  # fmt: skip
    client.execute(cwd=str(tmp_path))
    setup, watched, shown, printed, only, after = (cell.outputs for cell in notebook.cells)
    assert [o for o in setup + watched + shown + printed + after if o.output_type == "error"] == []
    (result,) = [o for o in watched if o.output_type == "execute_result"]
    assert result.data["text/plain"] == "(15, True)"  # 15 data-free steps, every turn measured

    (result,) = shown
    plain = result.data["text/plain"]
    assert plain.startswith("<loaderdoctor run of 'nb_watch'") and "'nb_watch': critical input-bound" in plain
    assert len(plain.splitlines()) <= 4 and "Recording(" not in plain
    parser = _Frames()
    parser.feed(result.data["text/html"])
    (frame,) = parser.frames
    assert frame["sandbox"] == "" and "nb_watch" in frame["srcdoc"]
    text = " ".join("".join(o.get("text", "") for o in printed if o.output_type == "stream").split())
    assert "loader 'nb_watch'" in text and "15 steps trained on repeated batches" in text

    (error,) = [o for o in only if o.output_type == "error"]
    assert error.ename == "CeilingMeasured"
    assert error.traceback == [
        "CeilingMeasured: the loop was ended once its ceiling was measured (ceiling_only); see its report"
    ]
    streams = "".join(o.get("text", "") for o in only if o.output_type == "stream")
    assert "To exit" not in streams and "never printed" not in streams
    assert "the ceiling is measured (15 data-free steps)" in streams
    steps = int("".join(o.get("text", "") for o in after).split()[-1])
    assert steps > 15  # the next cell ran, after the turns' steps
