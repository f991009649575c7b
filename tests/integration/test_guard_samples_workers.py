"""Bad samples under the guard with real workers: "skip" keeps every batch's size, replaces each bad sample by
the next index that loads and reports it exactly once, also across a restart and an epoch left early; "raise"
names the index in an error of the sample's own class with the worker's traceback."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.guard import guard
from loaderdoctor.tap.watchdog import StallPolicy

pytestmark = [pytest.mark.workers, pytest.mark.timeout(60)]

QUICK = StallPolicy(floor_s=1.5, first_batch_s=20.0)
SEED = 99
N = 48  # 12 batches of 4
BAD = {5: 6, 17: 19, 18: 19, 47: 0}  # bad index -> the next index that loads (18 is bad too; 47 wraps to 0)


class Broken(Dataset):
    """Returns its index; the BAD indices raise ValueError. In a worker, SIGKILLs itself once at `kill_at`, but
    only once index `after[0]` has been loaded `after[1]` times (by another worker: it waits for that)."""

    def __init__(
        self, marker_dir: Path | None = None, kill_at: int | None = None, after: tuple[int, int] | None = None
    ) -> None:
        self.marker = None if marker_dir is None else str(marker_dir / "killed")
        self.loads = None if marker_dir is None else str(marker_dir / "loads")
        self.kill_at = kill_at
        self.after = after

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        if self.after is not None and index == self.after[0]:
            with open(self.loads, "a") as loads:
                loads.write(".")
        if index == self.kill_at and get_worker_info() is not None and self._first_time():
            self._wait_for_the_loads()
            os.kill(os.getpid(), signal.SIGKILL)
        if index in BAD:
            raise ValueError(f"unreadable sample {index}")  # the line the worker's traceback shows
        return index

    def _wait_for_the_loads(self) -> None:
        deadline = time.monotonic() + 20.0  # a backstop: past it, the test's own assertions say what went wrong
        while self.after is not None and time.monotonic() < deadline:
            if os.path.exists(self.loads) and len(Path(self.loads).read_text()) >= self.after[1]:
                return
            time.sleep(0.01)

    def _first_time(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


def _loader(dataset: Dataset, *, shuffle: bool = True, **kwargs) -> DataLoader:
    generator = torch.Generator().manual_seed(SEED)
    return DataLoader(dataset, batch_size=4, shuffle=shuffle, generator=generator, **kwargs)


def _expected(epochs: int, *, shuffle: bool = True) -> list[list[list[int]]]:
    """The plain loader's batches over a fault-free dataset, each bad index replaced by the rule."""
    plain = _loader(list(range(N)), shuffle=shuffle)
    return [[[BAD.get(i, i) for i in batch.tolist()] for batch in plain] for _ in range(epochs)]


def _bad_in_order(epochs: list[list[list[int]]], *, shuffle: bool = True) -> list[tuple[int, int, int]]:
    """(epoch, batch, index) of each bad sample, in the order the plain loader meets them."""
    plain = _loader(list(range(N)), shuffle=shuffle)
    return [
        (epoch, position, i)
        for epoch in range(len(epochs))
        for position, batch in enumerate(plain)
        for i in batch.tolist()
        if i in BAD
    ]


def _skip_events(guarded) -> list[tuple[int, int, int]]:
    return [(e.epoch, e.batch, e.detail["index"]) for e in guarded.events if e.kind == "sample-skipped"]


@pytest.mark.parametrize(("workers", "start_method"), [(1, "fork"), (2, "fork"), (2, "forkserver")])
def test_skip_keeps_every_batch_and_reports_each_bad_sample_once(caplog, workers, start_method):
    caplog.set_level(logging.WARNING, logger="loaderdoctor")
    user = _loader(Broken(), num_workers=workers, multiprocessing_context=start_method)
    with guard(user, on_sample_error="skip", max_bad_fraction=0.1, stall_timeout=QUICK) as guarded:
        got = [[b.tolist() for b in guarded] for _ in range(2)]
        assert got == _expected(2)
        assert all(len(batch) == 4 for epoch in got for batch in epoch)
        assert _skip_events(guarded) == _bad_in_order(got)
        assert guarded.skipped == [i for _, _, i in _bad_in_order(got)]
        skips = [e for e in guarded.events if e.kind == "sample-skipped"]
        assert all(e.detail["replacement"] == BAD[e.detail["index"]] for e in skips)
        assert all("# the line the worker's traceback shows" in e.detail["traceback"] for e in skips)
    logged = [r.getMessage() for r in caplog.records if "skipped at epoch" in r.getMessage()]
    assert logged == [e.message for e in skips]


def test_skip_reports_each_bad_sample_once_across_a_restart(tmp_path):
    # No shuffle: batch k holds 4k..4k+3. A worker dies at index 13 (batch 3) after the other has loaded batch 4
    # (17 and 18 in it) ahead: batch 4 is loaded again after the restart, and reported once, when delivered.
    # Loading batch 4 loads 19 three times (in place of 17, of 18, then itself): the death waits for that.
    # The death (a SIGKILL, as the OOM killer sends) names index 13 but does not skip it: a SIGKILL may fall on any
    # sample; only a crash of the worker's own (SIGSEGV...) blames the sample.
    dataset = Broken(tmp_path, kill_at=13, after=(19, 3))
    user = _loader(dataset, shuffle=False, num_workers=2, multiprocessing_context="fork")
    with guard(user, on_sample_error="skip", max_bad_fraction=0.1, stall_timeout=QUICK) as guarded:
        got = []
        for batch in guarded:
            got.append(batch.tolist())
            time.sleep(0.05 if len(got) < 3 else 0)  # a training step, while the workers load ahead
        assert got == _expected(1, shuffle=False)[0]
        kinds = [e.kind for e in guarded.events if e.kind != "setting-changed"]
        assert sorted(kinds) == ["restart"] + ["sample-skipped"] * 4 + ["worker-died"]
        assert _skip_events(guarded) == [(0, 1, 5), (0, 4, 17), (0, 4, 18), (0, 11, 47)]
        assert [e.detail["index"] for e in guarded.events if e.kind == "worker-died"] == [13]
        # Both the dead workers' loader and the new one's reported 17: loaded twice, delivered and recorded once.
        reports = Path(guarded._resources.dump_dir).glob("skipped-*.jsonl")
        assert sum(path.read_text().count('"index": 17,') for path in reports) == 2


def test_skip_forgets_the_bad_samples_of_batches_loaded_ahead_and_never_delivered():
    user = _loader(Broken(), shuffle=False, num_workers=2, multiprocessing_context="fork")
    with guard(user, on_sample_error="skip", max_bad_fraction=0.1) as guarded:
        batches = iter(guarded)
        assert next(batches).tolist() == [0, 1, 2, 3]  # batch 1 (with 5) is loading ahead meanwhile
        assert [b.tolist() for b in guarded] == _expected(1, shuffle=False)[0]
        assert _skip_events(guarded) == [(1, 1, 5), (1, 4, 17), (1, 4, 18), (1, 11, 47)]


def test_raise_names_the_index_keeps_the_class_and_the_workers_traceback():
    user = _loader(Broken(), shuffle=False, num_workers=2, multiprocessing_context="fork")
    with guard(user) as guarded:
        batches = iter(guarded)
        assert next(batches).tolist() == [0, 1, 2, 3]
        with pytest.raises(ValueError) as raised:
            next(batches)
        assert next(batches).tolist() == [8, 9, 10, 11]
    text = str(raised.value)
    assert type(raised.value) is ValueError
    assert text.startswith("Caught ValueError in DataLoader worker process")
    assert "# the line the worker's traceback shows" in text
    assert text.rstrip().endswith("ValueError: dataset[5] raised ValueError: unreadable sample 5")


def test_too_many_bad_samples_end_a_run_with_workers():
    user = _loader(Broken(), shuffle=False, num_workers=1, multiprocessing_context="fork")
    with guard(user, on_sample_error="skip", max_bad_fraction=0.0) as guarded:
        delivered = []
        with pytest.raises(LoaderDoctorError, match=r"epoch 0, batch 1: 1 of the 8 samples seen.*Bad indices: 5\."):
            delivered.extend(b.tolist() for b in guarded)
        assert delivered == [[0, 1, 2, 3]]
