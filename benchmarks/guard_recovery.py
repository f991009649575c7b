"""How fast the guard gets a job going again: seconds from an injected fault to the next delivered batch.

Usage: python benchmarks/guard_recovery.py [RUNS]

A worker hangs forever (or kills itself) at one sample, once; the guarded loader must notice, end the workers,
restart them one rung down its ladder and resume at the first batch not yet delivered. The fault's time is
written by the worker itself, the stall's by the guard's log record, the next batch's by the loop.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset, get_worker_info

import harness
import loaderdoctor
from loaderdoctor.tap.watchdog import StallPolicy

FAULT_AT = 37


class FaultOnce(Dataset):
    """Returns its index; in a worker, at FAULT_AT and only the first time, hangs forever or kills itself."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.mark = Path(tempfile.mkdtemp(prefix="guard-bench-")) / "fault-time"

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == FAULT_AT and get_worker_info() is not None and not self.mark.exists():
            self.mark.write_text(repr(time.time()))
            if self.fault == "hang":
                threading.Event().wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor(index)


class _StallTimes(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "stall at" in record.getMessage():
            self.times.append(time.time())


def run_once(fault: str, start_method: str, stall_timeout: float) -> tuple[float, float | None, bool]:
    """(seconds from the fault to the next batch, from the stall's notice to it or None, every index once)."""
    stalls = _StallTimes()
    logging.getLogger("loaderdoctor").addHandler(stalls)
    dataset = FaultOnce(fault)
    # The restarted workers' first batch gets the default start-up deadline: a spawned worker takes about 2 s to
    # start on a busy 2-core machine, which a 2 s deadline would call a stall again (and the run give up).
    policy = StallPolicy(floor_s=stall_timeout)
    loader = loaderdoctor.DataLoader(
        dataset, batch_size=8, num_workers=2, multiprocessing_context=start_method, stall_timeout=policy
    )
    seen: list[int] = []
    resumed_at = None
    try:
        for batch in loader:
            if resumed_at is None and dataset.mark.exists() and FAULT_AT in batch.tolist():
                resumed_at = time.time()
            seen.extend(batch.tolist())
    finally:
        loader.close()
        logging.getLogger("loaderdoctor").removeHandler(stalls)
    fault_at = float(dataset.mark.read_text())
    assert resumed_at is not None
    from_stall = resumed_at - stalls.times[0] if stalls.times else None
    return resumed_at - fault_at, from_stall, seen == list(range(64))


def main(argv: list[str]) -> int:
    args = harness.parser(__doc__, rounds=3, rounds_as="RUNS").parse_args(argv)
    stall_timeout = 2.0
    table = harness.Table(
        [
            harness.Column("fault", 8, align="<"),
            harness.Column("start method", 13, align="<"),
            harness.Column("fault -> next batch s", 22, ".2f"),
            harness.Column("stall noticed -> next batch s", 30, ".2f"),
            harness.Column("every index once", 17),
        ]
    )
    print(f"stall deadline {stall_timeout:g} s after the first batch, 2 workers, {args.rounds} runs each (medians)")
    table.header()
    with harness.Results(__file__, args) as results:
        for fault, start_method in (("hang", "fork"), ("hang", "forkserver"), ("kill", "fork"), ("kill", "forkserver")):
            runs = [run_once(fault, start_method, stall_timeout) for _ in range(args.rounds)]
            total = statistics.median(r[0] for r in runs)
            from_stall = harness.median(r[1] for r in runs)
            exact = all(r[2] for r in runs)
            table.row(fault, start_method, total, from_stall, "yes" if exact else "NO")
            results.add(fault=fault, start_method=start_method, fault_to_batch_s=total, stall_to_batch_s=from_stall,
                        every_index_once=exact)  # fmt: skip
            results.figures[f"{fault}, {start_method}: fault -> next batch s"] = total
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
