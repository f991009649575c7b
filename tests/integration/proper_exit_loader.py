"""The loading process of test_guard_torch_exit's proper-exit cases: torch's own _test_proper_exit, run under
loaderdoctor.patch(). Arguments: EXIT_METHOD (none, loader_error, worker_error, worker_kill), HOLD_ITER_REFERENCE
and PERSISTENT_WORKERS (0 or 1), ERROR_FILE. Prints its workers' pids as JSON after iter(), and the exception
that ends it, if one does, as JSON before it propagates.

Ported from pytorch/pytorch test/test_dataloader.py (BSD-3-Clause): _test_proper_exit and TestProperExitDataset,
map-style with workers (the cases the guard takes over); the mp.Event that makes the last worker fail is a file
here, and the faulthandler worker_init_fn is left out.
"""

from __future__ import annotations

import gc
import json
import os
import sys

import psutil
import torch

import loaderdoctor

JOIN_TIMEOUT = 60.0


class ProperExitDataset(torch.utils.data.Dataset):
    def __init__(self, size: int, error_file: str | None) -> None:
        self.size = size
        self.error_file = error_file

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> torch.Tensor:
        worker_info = torch.utils.data.get_worker_info()
        error_event_set = self.error_file is not None and os.path.exists(self.error_file)
        if error_event_set and worker_info.id == worker_info.num_workers - 1:
            # only error in the last worker
            raise RuntimeError("Worker error")
        return torch.tensor([idx])


def _report(**facts: object) -> None:
    print(json.dumps(facts), flush=True)


def _kill_pid(pid: int) -> None:
    process = psutil.Process(pid)
    process.kill()
    process.wait(JOIN_TIMEOUT)
    assert not process.is_running()


def proper_exit(exit_method: str, hold_iter_reference: bool, persistent_workers: bool, error_file: str) -> None:
    num_workers = 2
    ds = ProperExitDataset(12, error_file if exit_method == "worker_error" else None)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=1, shuffle=False, num_workers=num_workers, persistent_workers=persistent_workers
    )
    assert isinstance(loader, loaderdoctor.GuardedLoader)
    error_it = 2
    assert len(loader) > (error_it + 2 + 1) * num_workers

    it = iter(loader)
    workers = it._workers
    _report(workers=[w.pid for w in workers])

    for i, _ in enumerate(it):
        if i == 0:
            if not hold_iter_reference:
                del it
                del loader
            # ensure that the workers are still alive
            for w in workers:
                assert w.is_alive()
            if exit_method == "worker_error":
                open(error_file, "w").close()
        if i == error_it:
            if exit_method == "loader_error":
                raise RuntimeError("Loader error")
            if exit_method == "worker_kill":
                _kill_pid(workers[-1].pid)  # kill last worker

    if not hold_iter_reference:
        gc.collect()


def main() -> None:
    exit_method, hold, persistent, error_file = sys.argv[1:]
    loaderdoctor.patch()
    try:
        proper_exit(exit_method, hold == "1", persistent == "1", error_file)
    except BaseException as error:
        _report(error=type(error).__name__, runtime_error=isinstance(error, RuntimeError), message=str(error))
        raise


if __name__ == "__main__":
    main()
