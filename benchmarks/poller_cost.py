"""What polling the workers costs a training loop: a plain loop against the same loop while check's poller reads
its workers, with the rounds spaced by their cost (as now) and every 0.25 s whatever they cost (as before).

Usage: python benchmarks/poller_cost.py [ROUNDS] [GIB]

A dataset held in memory (GIB GiB, 2 by default: a dataset read whole into RAM), six persistent workers forked
from it, each sample 2 ms of CPU, a training step of 5 ms of CPU. Reading a worker's USS makes the kernel walk
its pages, in the polling process: about 30 ms a round per such worker here. Each round times one epoch of each
of the three, the order turning by one every round so that a drift on the machine favours none. The table gives
the median batches per second of each and the median of the per-round ratios to the plain loop; the goal is
0.95 or more for the sampled loop as now. Run it on an otherwise quiet machine.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

import harness
from loaderdoctor.workers import poller as polling
from loaderdoctor.workers.poller import WorkerPoller


class InMemory(Dataset):
    """Rows of a tensor of `gib` GiB held in memory; each sample takes 2 ms of CPU."""

    def __init__(self, gib: float, size: int = 1024) -> None:
        self.data = torch.ones(int(gib * 2**30) // 4 // 1024, 1024)
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        row = self.data[index * 97 % len(self.data)]
        spent = time.thread_time() + 0.002
        while time.thread_time() < spent:
            pass
        return row[:64].clone()


def _step(batch: torch.Tensor) -> None:
    """5 ms of CPU: the training step."""
    spent = time.perf_counter() + 0.005
    while time.perf_counter() < spent:
        pass


@contextlib.contextmanager
def _sampled(share: float) -> Iterator[WorkerPoller]:
    """check's poller over this process's workers, every 0.25 s at most `share` of a core."""
    own = psutil.Process()
    previous = polling.MAX_SAMPLING_SHARE
    polling.MAX_SAMPLING_SHARE = share
    poller = WorkerPoller(lambda: [child.pid for child in own.children()]).start()
    try:
        yield poller
    finally:
        poller.stop()
        polling.MAX_SAMPLING_SHARE = previous


def _in_turns(loader: DataLoader, rounds: int) -> tuple[list[dict[str, float]], dict[str, list[int]]]:
    """Each round's rate of the three loops (the order turning by one every round), and the rounds of readings the
    sampled ones took."""
    taken: dict[str, list[int]] = {"sampled, spaced by cost": [], "every 0.25 s": []}

    def sampled(kind: str, share: float) -> float:
        with _sampled(share) as poller:
            rate = harness.loop_rate(loader, _step)
        taken[kind].append(len(poller.host_readings))
        return rate

    kinds = {
        "plain": lambda: harness.loop_rate(loader, _step),
        "sampled, spaced by cost": lambda: sampled("sampled, spaced by cost", polling.MAX_SAMPLING_SHARE),
        "every 0.25 s": lambda: sampled("every 0.25 s", float("inf")),
    }
    return list(harness.in_turns(kinds, rounds, order="rotate")), taken


def main(argv: list[str]) -> int:
    parser = harness.parser(__doc__, rounds=5, rounds_as="ROUNDS")
    parser.add_argument("gib", metavar="GIB", type=float, nargs="?", default=2.0, help="GiB held in memory")
    args = parser.parse_args(argv)
    logging.getLogger("loaderdoctor").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    with harness.Results(__file__, args) as results:
        loader = DataLoader(InMemory(args.gib), batch_size=4, num_workers=6, persistent_workers=True)
        harness.loop_rate(loader, _step)  # warm-up: the workers started
        measured, taken = _in_turns(loader, args.rounds)
        del loader
        print(f"six workers forked from {args.gib:g} GiB held in memory; {args.rounds} rounds, one epoch of each per "
              "round")  # fmt: skip
        table = harness.Table([harness.Column("loop", 26, align="<"), harness.Column("batches/s", 10, ".1f"),
                               harness.Column("of plain", 9, ".2f"), harness.Column("rounds of readings", 18, ".0f")],
                              rule=False)  # fmt: skip
        table.header()
        for kind in measured[0]:
            ratio = harness.median_ratio(measured, kind, "plain")
            rate, rounds_taken = harness.median(r[kind] for r in measured), harness.median(taken.get(kind, []))
            table.row(kind, rate, ratio, rounds_taken)
            results.add(loop=kind, batches_per_s=rate, of_plain=ratio, rounds_of_samples=rounds_taken)
            results.figures[f"{kind}: of plain"] = ratio
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
