"""`loaderdoctor run --log-to tensorboard` on an unmodified script, in a process of its own: the diagnosis of its
loader from its real steps logged as TensorBoard scalars and text, read back from the event file, its page beside
it; the script's output and exit status its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = [pytest.mark.workers, pytest.mark.timeout(180)]

STARVED = """\
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):  # 4 x 10 ms of loading per batch in the main process, against a 2 ms step
    def __len__(self):
        return 64

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.tensor([index], dtype=torch.float32)

loader = DataLoader(Slow(), batch_size=4)
for epoch in range(2):
    for batch in loader:
        time.sleep(0.002)
print("trained")
"""


def test_a_starved_scripts_diagnosis_is_logged_to_tensorboard(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(STARVED))
    result = subprocess.run(
        [sys.executable, "-m", "loaderdoctor", "run", "--no-history", "--log-to", "tensorboard", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    assert "logged to tensorboard" in result.stderr, result.stderr

    folder = tmp_path / "runs" / "loaderdoctor"
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    name = "train.py:13"  # the loader is named by the line that made it
    (wait,) = events.Scalars(f"loaderdoctor/{name}/wait_fraction")
    assert wait.value > 0.5  # about 40 ms of loading against a 2 ms step
    (text,) = events.Tensors("loaderdoctor/run_findings/text_summary")
    assert f"critical input-bound ({name})" in text.tensor_proto.string_val[0].decode()
    assert "input-bound" in (folder / "loaderdoctor-run.html").read_text()
