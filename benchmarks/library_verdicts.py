"""Whether check's verdict holds on pipelines built with the libraries users bring (issue 49), quiet and beside one
and two CPU hogs, N runs of each, every verified speedup compared with plain loops under the same load: the
machinery of benchmarks/busy_verdicts.py (its columns and its summary) over these loaders.

Usage: python benchmarks/library_verdicts.py [--runs N] [--budget S] [--loads 0,1,2] [--plain-s S] [--rounds N]
       [NAME ...]

The loaders (none designed for loaderdoctor; each skipped where its library is not installed):
- litdata-starved: litdata's StreamingDataLoader over a dataset that `litdata.optimize` wrote, each sample
  decoded (an FFT of a 96x96 image tiled to 288x288, about 5 ms of CPU) in the main process (num_workers=0),
  beside a 20 ms step: starved, critical at every load;
- litdata-workers: the same with 2 workers started each epoch and an 80 ms step: it keeps up; its workers run
  litdata's threads, nearly idle (no oversubscription);
- opencv: 720p images blurred and resized with OpenCV in 2 workers, whose OpenCV pools compute beside them on 2
  cores; the fix limits each worker's pools, measured against plain loops;
- text: Hugging Face datasets tokenized with a BPE tokenizer trained here, in the main process, a 2 ms step (the
  datasets map starts tqdm's monitor thread: no reason to leave fork);
- video: PyAV decoding 24 frames of an mpeg4 clip a sample, in the main process, a 5 ms step.
The summary's lines per loader: the same main finding in every run; no critical finding on a healthy loader
(litdata-workers); every verified speedup within 25% of the plain loops' (or within their rounds' range under
load). The benchmark measures and prints; it asserts nothing and exits 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import busy_verdicts
from loaderdoctor.loader.workload import Workload

HERE = Path(__file__).resolve()
# Made once by the parent (see _prepared); the checks and plain loops it starts find the files there.
FOLDER_VARIABLE = "LOADERDOCTOR_BENCH_LIBRARIES"


def _folder() -> Path:
    return Path(os.environ[FOLDER_VARIABLE])


def _decoded(image: np.ndarray) -> torch.Tensor:
    """About 5 ms of CPU a sample: the magnitudes of a 2-D FFT of the image tiled to 288x288, as a decoder's
    transform would cost."""
    spectrum = np.abs(np.fft.fft2(np.tile(image, (3, 3)).astype(np.float32)))
    return torch.from_numpy(np.log1p(spectrum[:32, :32]).astype(np.float32))


def _streaming(num_workers: int) -> DataLoader:
    import litdata

    class Decoded(litdata.StreamingDataset):
        def __getitem__(self, index):  # type: ignore[no-untyped-def]
            return _decoded(super().__getitem__(index)["image"])

    return litdata.StreamingDataLoader(Decoded(str(_folder() / "lit")), batch_size=16, num_workers=num_workers)


def litdata_starved() -> Workload:
    return Workload(_streaming(0), step_ms=20)


def litdata_workers() -> Workload:
    return Workload(_streaming(2), step_ms=80)


class Frames(Dataset):
    """720p frames, blurred and resized with OpenCV (whose pool of its own computes in every worker)."""

    def __len__(self) -> int:
        return 192

    def __getitem__(self, index: int) -> torch.Tensor:
        import cv2

        frame = np.random.default_rng(index).integers(0, 255, (720, 1280, 3), dtype=np.uint8)
        frame = cv2.GaussianBlur(frame, (15, 15), 0)
        return torch.from_numpy(cv2.resize(frame, (320, 180))).float().mean(dim=2)


def opencv() -> Workload:
    return Workload(DataLoader(Frames(), batch_size=4, num_workers=2, persistent_workers=True), step_ms=10)


WORDS = ["loader", "batch", "worker", "epoch", "tensor", "sample", "stream", "shard", "token", "model", "cache"]


def text() -> Workload:
    from datasets import Dataset as Rows
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    lines = [" ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(64)) for i in range(2000)]
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "[PAD]"]))

    class Tokenized(Dataset):
        def __init__(self) -> None:
            self.rows = Rows.from_dict({"text": lines}).map(lambda row: {"n": len(row["text"])})

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, index: int) -> torch.Tensor:
            ids = tokenizer.encode(self.rows[index]["text"]).ids[:128]
            return torch.tensor(ids + [1] * (128 - len(ids)))

    return Workload(DataLoader(Tokenized(), batch_size=32), step_ms=2)


class Clips(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        import av

        with av.open(str(_folder() / "clip.mp4")) as video:
            frames = [f.to_ndarray(format="rgb24") for _, f in zip(range(24), video.decode(video=0), strict=False)]
        return torch.from_numpy(np.stack(frames)).float().mean(dim=(1, 2, 3))


def video() -> Workload:
    return Workload(DataLoader(Clips(), batch_size=2), step_ms=5)


LIBRARIES = {
    "litdata-starved": "litdata",
    "litdata-workers": "litdata",
    "opencv": "cv2",
    "text": "datasets",
    "video": "av",
}
LOADERS = {
    "litdata-starved": litdata_starved,
    "litdata-workers": litdata_workers,
    "opencv": opencv,
    "text": text,
    "video": video,
}
SUITE = busy_verdicts.Suite(HERE, LOADERS, frozenset({"litdata-workers"}), __doc__ or "")

OPTIMIZE = """\
import litdata, numpy as np

def sample(i):
    return {"index": i, "image": np.random.default_rng(i).integers(0, 255, (96, 96), dtype=np.uint8)}

if __name__ == "__main__":
    litdata.optimize(fn=sample, inputs=list(range(768)), output_dir="lit", chunk_bytes="1MB", num_workers=1)
"""


def _write_clip(path: Path, frames: int = 96) -> None:
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=24)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        for i in range(frames):
            image = np.random.default_rng(i).integers(0, 255, (240, 320, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def _prepared(folder: Path, names: list[str]) -> list[str]:
    """The files the loaders read, made in `folder`; the names whose library is installed."""
    import importlib.util

    kept = [n for n in names if importlib.util.find_spec(LIBRARIES.get(n, n)) is not None]
    for name in sorted(set(names) - set(kept)):
        print(f"{name}: skipped ({LIBRARIES[name]} is not installed)")
    if any(n.startswith("litdata") for n in kept):
        # optimize() sets its process's start method to spawn: it runs in a process of its own.
        (folder / "optimize.py").write_text(OPTIMIZE)
        subprocess.run([sys.executable, "optimize.py"], cwd=folder, check=True, capture_output=True, timeout=300)
    if "video" in kept:
        _write_clip(folder / "clip.mp4")
    return kept


def main(argv: list[str]) -> int:
    if "--plain" in argv:  # a plain loop, in a process the parent started with the folder set
        return busy_verdicts.main(argv, SUITE)
    names = [a for a in argv if a in LOADERS]
    options = [a for a in argv if a not in LOADERS]
    with tempfile.TemporaryDirectory(prefix="loaderdoctor-libraries-") as folder:
        os.environ[FOLDER_VARIABLE] = folder
        kept = _prepared(Path(folder), names or list(LOADERS))
        return busy_verdicts.main(options + kept, SUITE) if kept else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
