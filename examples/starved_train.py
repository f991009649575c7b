"""A training script whose loader starves its step: every sample is "decoded" (a few ms of CPU) in the main
process, while the step (a sleep standing for an accelerator's step) waits. Try:

    python examples/starved_train.py --epochs 2
    loaderdoctor run examples/starved_train.py --epochs 2
"""

import argparse
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Decoded(Dataset):
    """Samples that cost a few ms of CPU each, like decoding and augmenting an image."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(index)
        image = rng.random((128, 128, 3))
        for _ in range(12):
            image = np.sqrt(image * 0.5 + 0.25)
        return torch.from_numpy(image).float().permute(2, 0, 1), index % 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    loader = DataLoader(Decoded(), batch_size=32, shuffle=True)
    for epoch in range(args.epochs):
        started = time.perf_counter()
        for _images, _labels in loader:
            time.sleep(0.02)  # the accelerator's step
        print(f"epoch {epoch}: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
