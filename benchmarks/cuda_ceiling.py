"""How far the wait model's estimate of a CUDA job's ceiling is from the ceiling measured with the input taken
away (issue 36, point 5), for a small convnet trained with pinned memory and non_blocking copies: loader-bound,
balanced and compute-bound.

Usage: python benchmarks/cuda_ceiling.py [--turn-s S] [--turns N] [MODE ...]      (needs a CUDA device)
       python benchmarks/cuda_ceiling.py --train MODE [--epochs N]                 (the training script itself)

For each mode, in one process: the real loop and a data-free loop (the last batch the loader delivered, as it
delivered it: pinned, on the CPU, copied with non_blocking each step, so the loop, the model and the step are the
same) in turns of --turn-s seconds, real first, so that drift cancels; the device synchronized at each turn's end.
The measured ceiling is the data-free rate over the real rate. The wait model's estimate is what a reading of the
loop's waits gives: 1 / (1 - time in next() / time of the turn), over the same real turns. Then `loaderdoctor run
--ceiling` on the same script (plain epochs) for the tool's own figures: its ceiling measured in the script's
data-free turns (to set beside the measured ceiling), the waits' reading, wait_fraction and the main finding.
The benchmark measures and prints; it asserts nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import harness

HERE = Path(__file__).resolve()
# mode: (CPU passes per sample, workers, model width, model depth)
MODES = {
    "loader-bound": (24, 2, 32, 2),
    "balanced": (6, 4, 128, 4),
    "compute-bound": (0, 6, 384, 8),
}
BATCH = 64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on a CPU it runs (to try it), but the figures are moot


class Images(Dataset):
    """Random 3x64x64 images, each smoothed `passes` times on the CPU (the decode and augment of a real one)."""

    def __init__(self, passes: int, length: int = 4096) -> None:
        self.passes, self.length = passes, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(index))
        for _ in range(self.passes):
            image = nn.functional.avg_pool2d(image, 3, 1, 1)
        return image[0], index % 10


def model_for(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10)]
    return nn.Sequential(*layers)


def parts(mode: str) -> tuple[DataLoader, nn.Module, torch.optim.Optimizer]:
    passes, workers, width, depth = MODES[mode]
    torch.backends.cudnn.benchmark = True
    pinned = DEVICE == "cuda"
    loader = DataLoader(Images(passes), batch_size=BATCH, shuffle=True, num_workers=workers, pin_memory=pinned,
                        persistent_workers=True, drop_last=True)  # fmt: skip
    model = model_for(width, depth).to(DEVICE)
    return loader, model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor], n: int) -> None:
    images, labels = batch[0].to(DEVICE, non_blocking=True), batch[1].to(DEVICE, non_blocking=True)
    loss = nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if n % 50 == 0:
        loss.item()  # the logging a training loop does now and then: a sync


def train(mode: str, epochs: int) -> None:
    """The training script as a user writes it: plain epochs."""
    loader, model, optimizer = parts(mode)
    n = 0
    for _ in range(epochs):
        for batch in loader:
            step(model, optimizer, batch, n)
            n += 1
    sync()


def turns(mode: str, turn_s: float, count: int) -> dict[str, float]:
    """Real and data-free turns, real first; rates in steps per second and the wait model's estimate."""
    loader, model, optimizer = parts(mode)
    batches = iter(_endless(loader))
    n, last = 0, None
    for _ in range(30):  # warm-up: workers started, cudnn's choice made
        last = next(batches)
        step(model, optimizer, last, n)
        n += 1
    sync()
    real_steps = free_steps = 0
    real_s = free_s = waited_s = 0.0
    for turn in range(2 * count):
        start = time.perf_counter()
        steps = 0
        while time.perf_counter() - start < turn_s:
            if turn % 2 == 0:
                asked = time.perf_counter()
                last = next(batches)
                waited_s += time.perf_counter() - asked
            step(model, optimizer, last, n)
            n += 1
            steps += 1
        sync()
        took = time.perf_counter() - start
        if turn % 2 == 0:
            real_steps, real_s = real_steps + steps, real_s + took
        else:
            free_steps, free_s = free_steps + steps, free_s + took
    real, free = real_steps / real_s, free_steps / free_s
    return {"real": real, "free": free, "measured": free / real, "estimate": 1 / max(1e-9, 1 - waited_s / real_s),
            "wait_fraction": waited_s / real_s}  # fmt: skip


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _endless(loader: DataLoader):
    while True:
        yield from loader


def tool_reading(mode: str, epochs: int, steps: int | None) -> dict[str, object]:
    """What `loaderdoctor run --ceiling [steps]` reads from the same script: its turns and its waits."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "run.json"
        env = {**os.environ, "LOADERDOCTOR_HOME": folder}
        result = subprocess.run(
            [sys.executable, "-m", "loaderdoctor", "run", "--ceiling", *([str(steps)] if steps else []), "--no-history",
             "--json", str(out), str(HERE), "--train", mode, "--epochs", str(epochs)],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        if not out.exists():
            return {"error": (result.stderr or result.stdout)[-800:]}
        loader = next(iter(json.loads(out.read_text())["loaders"].values()))
        findings = loader.get("findings") or []
        ceiling = loader["measurements"].get("ceiling") or {}
        return {
            "ceiling_speedup": ceiling.get("speedup"),  # run --ceiling's data-free turns, in the script itself
            "input_cost": ceiling.get("input_cost"),
            "wait_model_input_cost": ceiling.get("wait_model_input_cost"),
            "wait_fraction": loader["measurements"].get("wait_fraction"),
            "batches_per_s": loader["measurements"].get("batches_per_s"),
            "finding": f"{findings[0]['rule']} ({findings[0]['severity']})" if findings else "none",
            "turns": " ".join(  # each turn's rate, r(eal) or d(ata-free)
                f"{t['kind'][0]}{t['intervals'] / t['seconds']:.1f}"
                for t in loader["recording"]["ceiling"]["turns"]
                if t["seconds"]
            ),
        }


COLUMNS = [
    harness.Column("mode", 14, align="<"),
    harness.Column("real it/s", 9, ".1f", key="real"),
    harness.Column("data-free", 9, ".1f", key="free"),
    harness.Column("ceiling", 8, ".2f", "x", key="measured"),
    harness.Column("estimate", 8, ".2f", "x"),
    harness.Column("apart", 6, "+.0%"),
    harness.Column("tool: wait_fraction, b/s, main finding", align="<", gap=2, key="tool"),
]


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__doc__, rounds=3, rounds_as="--turns")
    parser.add_argument("modes", nargs="*", default=list(MODES))
    parser.add_argument("--train", choices=list(MODES))
    parser.add_argument("--epochs", type=int, default=3)  # enough for --ceiling's turns (64 batches an epoch)
    parser.add_argument("--ceiling-steps", type=int)  # the data-free steps of run --ceiling (its default if none)
    parser.add_argument("--turn-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.train:
        train(args.train, args.epochs)
        return
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
    print(f"{name}; {os.cpu_count()} cores; batch {BATCH}; {args.rounds} turns of "
          f"{args.turn_s:g} s each way")  # fmt: skip
    table = harness.Table(COLUMNS, rule=False)
    table.header()
    with harness.Results(__file__, args) as results:
        for mode in args.modes:
            measured = turns(mode, args.turn_s, args.rounds)
            tool = tool_reading(mode, args.epochs, args.ceiling_steps)
            apart = measured["estimate"] / measured["measured"] - 1
            row = table.row(mode, measured["real"], measured["free"], measured["measured"], measured["estimate"], apart,
                            tool)  # fmt: skip
            results.add(**row, device=name, wait_fraction=measured["wait_fraction"])
            results.figures[f"{mode}: estimate/measured ceiling"] = measured["estimate"] / measured["measured"]
            if isinstance(tool.get("ceiling_speedup"), float | int):
                results.figures[f"{mode}: tool/measured ceiling"] = tool["ceiling_speedup"] / measured["measured"]


if __name__ == "__main__":
    main()
