"""`loaderdoctor run --ceiling` on a CUDA device (issue 36, point 5): a batch handed again is the batch as the
loader delivered it (pinned by the loader's pin_memory; on the device where a collate put it there), and the real
stream is the stream without the turns. Skipped where torch sees no CUDA device: CI has none, a lent GPU runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.workers,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SCRIPT = """\
import json, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Numbers(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, index):
        return torch.full((3, 16, 16), float(index)), index

def on_device(samples):
    images = torch.stack([image for image, _ in samples]).cuda()
    return images, torch.tensor([index for _, index in samples]).cuda()

if sys.argv[1] == "pinned":  # workers, pinned by the loader, copied by the step
    loader = DataLoader(Numbers(), batch_size=8, shuffle=True, num_workers=2, pin_memory=True,
                        generator=torch.Generator().manual_seed(5))
else:  # the main process, the collate puts the batch on the device
    loader = DataLoader(Numbers(), batch_size=8, shuffle=True, collate_fn=on_device,
                        generator=torch.Generator().manual_seed(5))
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
seen = []
for epoch in range(3):
    for images, labels in loader:
        seen.append({"labels": labels.tolist(), "pinned": images.is_pinned(), "device": images.device.type})
        images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
        loss = nn.functional.cross_entropy(model(images), labels % 10)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
torch.cuda.synchronize()
with open(sys.argv[2], "w") as out:
    json.dump(seen, out)
"""


def _subprocess(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOADERDOCTOR_HOME": str(cwd / "home")}
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.parametrize(("kind", "pinned", "device"), [("pinned", True, "cpu"), ("collated", False, "cuda")])
def test_a_batch_handed_again_is_kept_as_delivered_and_the_real_stream_is_whole(tmp_path, kind, pinned, device):
    (tmp_path / "train.py").write_text(SCRIPT)
    plain = _subprocess(["train.py", kind, "plain.json"], tmp_path)
    assert plain.returncode == 0, plain.stderr
    args = ["-m", "loaderdoctor", "run", "--ceiling", "12", "--no-history", "--json", "out.json", "train.py", kind,
            "turns.json"]  # fmt: skip
    result = _subprocess(args, tmp_path)
    assert result.returncode == 0, result.stderr
    without = json.loads((tmp_path / "plain.json").read_text())
    under = json.loads((tmp_path / "turns.json").read_text())
    assert len(under) == len(without) + 12
    assert {(b["pinned"], b["device"]) for b in under} == {(pinned, device)}  # the repeats too
    kept = [b["labels"] for n, b in enumerate(under) if n == 0 or b["labels"] != under[n - 1]["labels"]]
    assert kept == [b["labels"] for b in without]  # every sample once, in order
    (loader,) = json.loads((tmp_path / "out.json").read_text())["loaders"].values()
    ceiling = loader["measurements"]["ceiling"]
    assert ceiling["data_free_steps"] == 12 and ceiling["complete"]
