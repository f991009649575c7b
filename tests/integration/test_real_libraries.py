"""Pipelines built with the libraries users bring, none designed for these tests (issue 49): OpenCV's own pool in
every forked worker, set by the fix that limits the workers' threads; litdata's StreamingDataLoader, whose
nearly idle threads are no oversubscription and whose starved loader is input-bound; Hugging Face datasets with a
tokenizer trained here, whose tqdm monitor is no reason to leave fork; PyAV decoding video in workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.workers, pytest.mark.timeout(300)]


def _python(argv: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf")}
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PATH": path, **offline})  # fmt: skip


def _check(cwd: Path, target: str, *extra: str) -> tuple[int, dict, str]:
    result = _python(["-m", "loaderdoctor", "check", target, "--json", "--no-history", *extra], cwd)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


OPENCV_POOL = """\
import cv2, numpy as np, torch
from torch.utils.data import Dataset

class Pools(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        image = cv2.GaussianBlur(np.random.rand(64, 64).astype(np.float32), (5, 5), 0)
        return torch.tensor([cv2.getNumThreads(), torch.get_num_threads(), float(image.mean() > -1)])
"""


def test_the_fix_that_limits_worker_threads_sets_opencvs_own_pool_in_every_worker(tmp_path, monkeypatch):
    cv2 = pytest.importorskip("cv2")
    if cv2.getNumThreads() < 2:
        pytest.skip("OpenCV keeps no pool of its own on one core")
    (tmp_path / "pools.py").write_text(OPENCV_POOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    from pools import Pools
    from torch.utils.data import DataLoader

    from loaderdoctor.loader.settings import LoaderSpec, Settings

    spec = LoaderSpec.from_loader(DataLoader(Pools(), batch_size=4))
    plain = spec.build(Settings(num_workers=2, start_method="fork"))
    limited = spec.build(Settings(num_workers=2, start_method="fork", worker_threads=1))
    as_is = {tuple(row[:2].tolist()) for batch in plain for row in batch}
    fixed = {tuple(row[:2].tolist()) for batch in limited for row in batch}
    assert as_is == {(float(cv2.getNumThreads()), 1.0)}  # torch gives each worker one thread; OpenCV does not
    assert fixed == {(1.0, 1.0)}


LITDATA_OPTIMIZE = """\
import litdata, numpy as np

def sample(i):
    return {"index": i, "image": np.full((16, 16), i % 251, dtype=np.uint8)}

if __name__ == "__main__":
    litdata.optimize(fn=sample, inputs=list(range(600)), output_dir="lit", chunk_bytes="64KB", num_workers=1)
"""

LITDATA_LOADERS = """\
import time
import litdata, torch

class Decoded(litdata.StreamingDataset):
    def __getitem__(self, index):
        item = super().__getitem__(index)
        time.sleep(0.004)  # decoding, as a real pipeline's would take
        return torch.tensor([float(item["index"]), torch.as_tensor(item["image"]).float().mean()])

def starved():
    return litdata.StreamingDataLoader(Decoded("lit"), batch_size=8, num_workers=0)

def workers():
    return litdata.StreamingDataLoader(Decoded("lit"), batch_size=8, num_workers=2)
"""


@pytest.fixture(scope="module")
def litdata_folder(tmp_path_factory) -> Path:
    pytest.importorskip("litdata")
    folder = tmp_path_factory.mktemp("litdata")
    (folder / "optimize.py").write_text(LITDATA_OPTIMIZE)
    (folder / "loaders.py").write_text(LITDATA_LOADERS)
    # optimize() sets the whole process's start method to spawn: it runs in a process of its own.
    made = _python(["optimize.py"], folder)
    assert made.returncode == 0 and (folder / "lit" / "index.json").exists(), made.stderr
    return folder


def test_litdatas_starved_streaming_loader_is_input_bound_and_named_by_its_class(litdata_folder):
    status, report, stderr = _check(litdata_folder, "loaders.py:starved", "--step-ms", "2", "--budget", "20")
    assert status == 1, stderr  # critical
    (loader,) = report["loaders"].values()
    assert loader["recording"]["loader_class"].endswith("StreamingDataLoader")
    rules = {f["rule"]: f for f in loader["findings"]}
    assert rules["input-bound"]["severity"] == "critical"
    assert rules["input-bound"]["evidence"]["wait_fraction"] > 0.5  # 32 ms of loading a batch against a 2 ms step


def test_litdatas_idle_threads_in_every_worker_are_no_oversubscription(litdata_folder):
    status, report, stderr = _check(litdata_folder, "loaders.py:workers", "--step-ms", "20", "--budget", "15")
    (loader,) = report["loaders"].values()
    rules = [f["rule"] for f in loader["findings"]]
    assert "cpu-oversubscription" not in rules, (rules, stderr)
    threads = [s["threads"] for s in loader["recording"]["worker_samples"]]
    assert max(threads) >= 3  # litdata's threads are there: they were counted before
    assert status == 0, (rules, stderr)  # 2 workers keep up with a 20 ms step


TEXT_PIPELINE = """\
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

WORDS = ["loader", "batch", "worker", "epoch", "tensor", "sample", "stream", "shard", "token", "model"]

def _tokenizer():
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    text = [" ".join(WORDS[(i * 7 + k) % 10] for k in range(12)) for i in range(300)]
    tokenizer.train_from_iterator(text, trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]", "[PAD]"]))
    tokenizer.enable_padding(pad_id=1, length=16)
    tokenizer.enable_truncation(16)
    return tokenizer, text

def loaders():
    tokenizer, text = _tokenizer()
    rows = Dataset.from_dict({"text": text * 4})
    rows = rows.map(lambda b: {"ids": [e.ids for e in tokenizer.encode_batch(b["text"])]}, batched=True)
    return torch.utils.data.DataLoader(rows.with_format("torch", columns=["ids"]), batch_size=16, num_workers=0)
"""


def test_a_text_pipelines_fix_keeps_fork_where_no_hazard_is_named(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "text.py").write_text(TEXT_PIPELINE)
    status, report, stderr = _check(tmp_path, "text.py:loaders", "--step-ms", "1", "--budget", "20")
    assert status in (0, 1), stderr
    (loader,) = report["loaders"].values()
    rules = {f["rule"]: f for f in loader["findings"]}
    assert "fork-unsafe" not in rules, rules  # tqdm's monitor (datasets' map) and tokenizers' pool: no hazards
    verification = loader["verification"]
    assert verification is not None and verification["settings"]["num_workers"] >= 1, rules  # workers added
    assert verification["settings"]["start_method"] in (None, "fork"), verification  # and forked, as by default


VIDEO = """\
import av, numpy as np, torch
from torch.utils.data import Dataset

def write(path, frames=120):
    with av.open(path, "w") as out:
        stream = out.add_stream("mpeg4", rate=24)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            image = np.full((64, 64, 3), i % 255, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)

class Clips(Dataset):
    def __init__(self, path):
        self.path = path
    def __len__(self):
        return 48
    def __getitem__(self, i):
        with av.open(self.path) as video:
            frames = [f.to_ndarray(format="rgb24") for _, f in zip(range(24), video.decode(video=0))]
        return torch.from_numpy(np.stack(frames)).float().mean()

def loaders():
    write("clip.mp4")
    return torch.utils.data.DataLoader(Clips("clip.mp4"), batch_size=2, num_workers=0)
"""


def test_pyav_decoding_in_the_main_process_is_input_bound_and_the_fix_is_measured(tmp_path):
    pytest.importorskip("av")
    (tmp_path / "video.py").write_text(VIDEO)
    status, report, stderr = _check(tmp_path, "video.py:loaders", "--step-ms", "2", "--budget", "25")
    assert status == 1, stderr
    (loader,) = report["loaders"].values()
    rules = {f["rule"]: f for f in loader["findings"]}
    assert rules["input-bound"]["severity"] == "critical"
    assert loader["verification"]["settings"]["num_workers"] >= 1
    assert loader["verification"]["verdict"] in ("faster", "no-gain", "not-measured"), loader["verification"]


WEBDATASET = """\
import glob, os
import numpy as np, torch, webdataset as wds

def _shards():
    if not glob.glob("shards/*.tar"):
        os.makedirs("shards", exist_ok=True)
        with wds.ShardWriter("shards/shard-%04d.tar", maxcount=64, verbose=0) as sink:
            for i in range(256):
                sink.write({"__key__": f"{i:06d}", "npy": np.full((8, 8), i, np.float32), "cls": i % 10})
    return sorted(glob.glob("shards/*.tar"))

def _every_shard(urls):
    return urls  # no split: each worker reads every shard

def _loader(splitter):
    stream = (wds.WebDataset(_shards(), shardshuffle=False, nodesplitter=wds.single_node_only,
                             workersplitter=splitter)
              .decode().to_tuple("npy", "cls").map(lambda s: (torch.from_numpy(s[0]), s[1])).batched(16))
    return torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2)

def split():
    return _loader(wds.split_by_worker)

def repeated():
    return _loader(_every_shard)
"""


def test_webdatasets_shards_split_by_worker_are_no_duplicates_and_unsplit_ones_are(tmp_path):
    # The library of our own choosing (issue 49): webdataset's tar shards, read by 2 workers.
    pytest.importorskip("webdataset")
    (tmp_path / "shards.py").write_text(WEBDATASET)
    _, good, stderr = _check(tmp_path, "shards.py:split", "--step-ms", "5", "--budget", "12")
    (loader,) = good["loaders"].values()
    assert "duplicate-samples" not in [f["rule"] for f in loader["findings"]], (loader["findings"], stderr)
    _, bad, stderr = _check(tmp_path, "shards.py:repeated", "--step-ms", "5", "--budget", "12")
    (loader,) = bad["loaders"].values()
    rules = {f["rule"]: f for f in loader["findings"]}
    assert "duplicate-samples" in rules, (list(rules), stderr)
    assert rules["duplicate-samples"]["evidence"]["copies_of_each_sample"] == 2
