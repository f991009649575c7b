"""check on pipelines modelled on real ones (no torchvision needed): what torchvision and lightning import, a
library's monitor thread beside a collate_fn that only fork can send, CPU-bound workers beyond the cores, an
IterableDataset that each worker repeats, spawned workers importing torch, a busy machine."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import loaderdoctor
from loaderdoctor.loader.settings import LoaderSpec, Settings
from loaderdoctor.loader.workload import Workload
from loaderdoctor.probe.measure import probe
from loaderdoctor.recording.rates import batches_per_s, training_rate
from shared_datasets import Crunch

pytestmark = [pytest.mark.workers, pytest.mark.timeout(240)]


class Augmented(Dataset):
    """Each sample computes for about 8 ms in numpy, as decoding and augmenting an image does."""

    def __init__(self, n: int = 256) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        image = np.random.default_rng(index).random((96, 96), dtype=np.float32)
        for _ in range(18):
            image = np.sqrt(image * image + 0.5)
        return torch.from_numpy(image[:8, :8].copy())


def _rules(report: loaderdoctor.Report) -> dict[str, loaderdoctor.Finding]:
    (loader,) = report.loaders.values()
    return {f.rule: f for f in loader.findings}


def test_importing_inductors_config_leaves_fork_alone():
    import torch._inductor.config  # noqa: F401  (torchvision and lightning do this on import)

    loader = DataLoader(Augmented(), batch_size=8, num_workers=0)
    report = loaderdoctor.check(Workload(loader, step_ms=10), budget_s=16)
    assert "fork-unsafe" not in _rules(report)
    (loader_report,) = report.loaders.values()
    fix = loader_report.verification
    assert fix is not None and fix.settings.num_workers >= 1
    assert fix.settings.effective_start_method == "fork"
    assert fix.verdict != "not-measured", fix.note


class _MonitorThread(threading.Thread):
    """Like tqdm's monitor, which datasets' .map leaves running in the main process."""

    def __init__(self) -> None:
        super().__init__(name="tqdm_monitor", daemon=True)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            pass


def test_a_monitor_thread_with_a_local_collate_fn_keeps_fork_and_names_the_thread():
    def collate(batch):  # local: forkserver cannot send it, fork can
        return torch.stack(batch)

    monitor = _MonitorThread()
    monitor.start()
    try:
        loader = DataLoader(Augmented(), batch_size=8, num_workers=2, collate_fn=collate)
        report = loaderdoctor.check(Workload(loader, step_ms=10), budget_s=16)
    finally:
        monitor.stop.set()
        monitor.join()
    finding = _rules(report)["fork-unsafe"]
    assert finding.settings_change == {}
    assert "tqdm_monitor" in finding.title and "in _MonitorThread.run" in finding.title
    assert "collate_fn" in finding.fix and "keep fork" in finding.fix
    (loader_report,) = report.loaders.values()
    fix = loader_report.verification
    if fix is not None:  # whatever else it changes, it is never a start method that cannot load this loader
        assert fix.settings.effective_start_method == "fork"
        assert "cannot be pickled" not in fix.note


@pytest.mark.quiet
def test_four_cpu_bound_workers_on_two_cores_are_not_told_to_add_workers():
    cores = len(os.sched_getaffinity(0))
    workers = 2 * cores
    loader = DataLoader(Crunch(96), batch_size=2, num_workers=workers, persistent_workers=True)
    report = loaderdoctor.check(Workload(loader, step_ms=5), budget_s=16, verify_fix=False)
    rules = _rules(report)
    bound = rules["input-bound"]
    assert bound.settings_change.get("num_workers", workers) <= workers
    assert "waits" not in bound.fix and "I/O" not in bound.fix
    assert "CPU-bound" in bound.fix
    assert bound.evidence["loading_cpu_share"] >= 0.75
    assert "cpu-oversubscription" in rules
    assert rules["cpu-oversubscription"].settings_change == {"num_workers": cores}


class Unsplit(IterableDataset):
    """A stream that does not split itself across workers: each worker yields all of it."""

    def __iter__(self):
        for i in range(64):
            yield torch.tensor([float(i)])


def test_workers_that_repeat_the_stream_are_reported():
    loader = DataLoader(Unsplit(), batch_size=4, num_workers=2)
    report = loaderdoctor.check(Workload(loader, step_ms=1), budget_s=10, verify_fix=False)
    finding = _rules(report)["duplicate-samples"]
    assert finding.severity == "critical"
    assert finding.evidence["copies_of_each_sample"] == 2
    assert finding.evidence["epoch_batches"] == 32  # 64 samples twice, in batches of 4
    assert "get_worker_info" in finding.snippet


def test_a_fix_that_would_repeat_the_stream_is_not_compared_and_says_why():
    class SlowUnsplit(Unsplit):
        def __iter__(self):
            for item in super().__iter__():
                time.sleep(0.01)
                yield item

    loader = DataLoader(SlowUnsplit(), batch_size=4, num_workers=0)
    report = loaderdoctor.check(Workload(loader, step_ms=5), budget_s=12)
    (loader_report,) = report.loaders.values()
    fix = loader_report.verification
    assert fix is not None and fix.settings.num_workers >= 2
    assert fix.verdict == "other-data" and not fix.helped and fix.speedup is None
    assert "duplicate-samples" in _rules(report)


def test_spawned_workers_importing_torch_are_not_memory_growth():
    loader = DataLoader(Augmented(64), batch_size=8, num_workers=2, multiprocessing_context="spawn")
    rec = probe(LoaderSpec.from_loader(loader), Settings(2, persistent_workers=True, start_method="spawn"), budget_s=3)
    assert rec.outcome == "completed"
    report_rules = {f.rule for f in loaderdoctor.rules.diagnose(rec)}
    assert "memory-growth" not in report_rules
    uss = [s.uss_bytes for s in rec.worker_samples if s.uss_bytes is not None]  # the rounds that read it
    assert min(uss) < max(uss)  # the workers did grow while they started: it is only not counted as growth


@pytest.mark.quiet
def test_a_short_trial_is_not_decided_by_start_up():
    loader = DataLoader(Augmented(512), batch_size=8, num_workers=2, multiprocessing_context="spawn")
    settings = Settings(2, persistent_workers=True, start_method="spawn")
    rec = probe(LoaderSpec.from_loader(loader), settings, budget_s=1.5, epochs=1)
    assert rec.epochs[0].first_batch_s > 0.5  # spawned workers take a while to start...
    steady = training_rate(rec)
    assert steady > 5 * batches_per_s(rec) or rec.wall_s < 2.0  # ...which the training rate leaves out
    assert len(rec.batches) > 20


@pytest.mark.quiet
def test_a_busy_machine_is_said_with_the_pids(tmp_path):
    pid_file = str(tmp_path / "hog.pid")  # written whole, then renamed: never read half-written
    spin = "import os, time\nopen(os.environ['PID_FILE'] + '.part', 'w').write(str(os.getpid()))\n"
    spin += "os.rename(os.environ['PID_FILE'] + '.part', os.environ['PID_FILE'])\nend = time.time() + 20\n"
    spin += "while time.time() < end:\n    pass\n"
    # Started through a shell that exits at once: the hog is nobody's child here, as another job would be.
    subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 &', spin],
        env={**os.environ, "PID_FILE": pid_file},
        check=True,
    )
    deadline = time.monotonic() + 10
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(pid_file) as handle:
        hog = int(handle.read())
    try:
        loader = DataLoader(Augmented(), batch_size=8, num_workers=0)
        rec = probe(LoaderSpec.from_loader(loader), budget_s=3, step_ms=5)
    finally:
        os.kill(hog, 9)
    assert hog in [p.pid for p in rec.other_processes]
    (busiest,) = [p for p in rec.other_processes if p.pid == hog]
    assert busiest.cores > 0.5
    assert loaderdoctor.report.measurements(rec)["other_processes_cores"] > 0.5
