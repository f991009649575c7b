"""The guard over an IterableDataset with state_dict()/load_state_dict(), against real workers that hang or are
killed and a main process that hangs: every sample exactly once, in the plain DataLoader's order, with events
saying what happened."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from faults import strikes
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loaderdoctor.errors import LoaderDoctorError
from loaderdoctor.guard import guard
from loaderdoctor.tap.watchdog import StallPolicy

pytestmark = [pytest.mark.workers, pytest.mark.timeout(90)]

# A planted hang is forever and healthy batches take milliseconds: a 1.5 s floor loses no margin. The first batch
# of an iterator (start-up, ~1-3 s under forkserver and spawn on 2 cores) keeps a generous deadline.
QUICK = StallPolicy(floor_s=1.5, first_batch_s=20.0)
N = 40
BATCH = 4


class Shards(IterableDataset):
    """Yields 0..N-1, sharded over the workers: worker w of k yields the items i with i % k == w (the whole range
    in the main process or a single worker). Worker `short_worker`'s stream, with more than one worker, stops
    below `short_below`. Its state is the position in its own stream.

    At item `at` it hangs or SIGKILLs itself once (a marker file says it happened, so the retry goes through), or
    every time; in workers only, or also in the main process; and only once `arm_file` exists, if given."""

    def __init__(
        self,
        *,
        at: int | None = None,
        fault: str = "hang",
        marker_dir: Path | None = None,
        once: bool = True,
        in_main: bool = False,
        arm_file: Path | None = None,
        short_worker: int | None = None,
        short_below: int = 0,
    ) -> None:
        self.at = at
        self.fault = fault
        self.marker = None if marker_dir is None else str(marker_dir / f"fault-{at}")
        self.once = once
        self.in_main = in_main
        self.arm_file = None if arm_file is None else str(arm_file)
        self.short_worker = short_worker
        self.short_below = short_below
        self.position = 0
        self._resuming = False

    def _stream(self) -> list[int]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        items = [i for i in range(N) if i % workers == worker]
        if workers > 1 and worker == self.short_worker:
            items = [i for i in items if i < self.short_below]
        return items

    def __iter__(self):
        stream = self._stream()
        if not self._resuming:
            self.position = 0
        self._resuming = False
        while self.position < len(stream):
            item = stream[self.position]
            self.position += 1
            if item == self.at and self._strikes():
                if self.fault == "hang":
                    threading.Event().wait()  # the planted hang
                else:
                    os.kill(os.getpid(), signal.SIGKILL)
            yield item

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self._resuming = True

    def _strikes(self) -> bool:
        if get_worker_info() is None and not self.in_main:
            return False
        return strikes(self.marker, arm_file=self.arm_file, once=self.once)
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


class ShardsWithWorkerFacts(Shards):
    """Each item with what the worker that loads it is told: its id and seed (get_worker_info()), the seed of its
    torch generator, and the id its worker_init_fn was called with."""

    init_id = -1

    def __iter__(self):
        info = get_worker_info()
        for item in super().__iter__():
            yield item, info.id, info.seed, torch.initial_seed(), self.init_id


def note_worker(worker_id: int) -> None:
    get_worker_info().dataset.init_id = worker_id  # through the guard's wrapper, to the user's dataset


def _loader(dataset: Shards, workers: int, start_method: str | None = None, **kwargs) -> DataLoader:
    extra = {"multiprocessing_context": start_method} if workers else {}
    return DataLoader(dataset, batch_size=BATCH, num_workers=workers, **extra, **kwargs)


def _plain_epoch(workers: int, **shards) -> list[list[int]]:
    """What the plain DataLoader delivers, with the same workers and no fault."""
    return [b.tolist() for b in _loader(Shards(**shards), workers, "fork" if workers else None)]


def _run(guarded, epochs: int, *, before_epoch=None, step_s: float = 0.0) -> list[list[list[int]]]:
    got = []
    for epoch in range(epochs):
        if before_epoch is not None:
            before_epoch(epoch)
        batches = []
        for batch in guarded:
            batches.append(batch.tolist())
            time.sleep(step_s)  # a training step: deaths also come while the user's code runs
        got.append(batches)
    return got


def _kinds(guarded) -> list[str]:
    return [e.kind for e in guarded.events if e.kind != "setting-changed"]


def test_the_plain_order_of_two_workers_is_their_streams_in_turn():
    # The reference the other tests compare with, spelled out once: batch k from worker k mod 2.
    assert _plain_epoch(2) == [
        [0, 2, 4, 6],
        [1, 3, 5, 7],
        [8, 10, 12, 14],
        [9, 11, 13, 15],
        [16, 18, 20, 22],
        [17, 19, 21, 23],
        [24, 26, 28, 30],
        [25, 27, 29, 31],
        [32, 34, 36, 38],
        [33, 35, 37, 39],
    ]
    # A stream that ends early drops out of the turn.
    assert _plain_epoch(2, short_worker=1, short_below=8) == [
        [0, 2, 4, 6],
        [1, 3, 5, 7],
        [8, 10, 12, 14],
        [16, 18, 20, 22],
        [24, 26, 28, 30],
        [32, 34, 36, 38],
    ]


@pytest.mark.parametrize(
    ("start_method", "workers", "persistent", "next_method"),
    [("fork", 1, None, "forkserver"), ("fork", 2, False, "forkserver"), ("forkserver", 2, None, "spawn")],
)
def test_a_worker_hanging_in_a_later_epoch_is_restarted_and_every_stream_goes_on_where_it_was(
    tmp_path, start_method, workers, persistent, next_method
):
    arm = tmp_path / "arm"
    # Item 13: worker 1's second batch of 2 workers (the epoch's batch 3), the epoch's batch 3 of 1 worker.
    dataset = Shards(at=13, marker_dir=tmp_path, arm_file=arm)
    extra = {} if persistent is None else {"persistent_workers": persistent}
    with guard(_loader(dataset, workers, start_method, **extra), stall_timeout=QUICK) as guarded:
        got = _run(guarded, 3, before_epoch=lambda epoch: epoch == 1 and arm.touch())
        # Epoch 2 comes from workers started for the restart: in the plain order again, from worker 0.
        assert got == [_plain_epoch(workers)] * 3
        assert _kinds(guarded) == ["stall", "restart"]
        stall, restart = [e for e in guarded.events if e.kind != "setting-changed"]
        assert (stall.epoch, stall.batch) == (1, 3) == (restart.epoch, restart.batch)
        assert any(s["stuck_frame"] and "in __iter__" in s["stuck_frame"] for s in stall.detail["stacks"])
        assert restart.detail["after"] == {**restart.detail["before"], "start_method": next_method}
        # Batch 2 came from worker 0 (of 2): the new workers deal from stream 1 on.
        assert restart.detail["streams"] == {"resumed": list(range(workers)), "first": 3 % workers}
        assert "(each worker's stream right after its last batch delivered) with " in restart.message


@pytest.mark.parametrize(("start_method", "workers", "persistent"), [("fork", 2, None), ("forkserver", 1, False)])
def test_a_worker_killed_mid_stream_is_replaced_and_its_stream_resumed(tmp_path, start_method, workers, persistent):
    dataset = Shards(at=13, fault="kill", marker_dir=tmp_path)
    extra = {} if persistent is None else {"persistent_workers": persistent}
    with guard(_loader(dataset, workers, start_method, **extra), stall_timeout=QUICK) as guarded:
        got = _run(guarded, 2, step_s=0.01)
        assert got == [_plain_epoch(workers)] * 2
        assert _kinds(guarded) == ["worker-died", "restart"]
        died, restart = [e for e in guarded.events if e.kind != "setting-changed"]
        # Workers load ahead (the first 4 batches are asked for at once): the death may be seen while an earlier
        # batch is the next to deliver, even the first.
        assert died.epoch == 0 and 0 <= died.batch <= 3 and restart.detail["resume_at"] == died.batch
        assert restart.detail["before"]["start_method"] == start_method


def test_a_worker_continuing_another_stream_is_told_that_streams_worker_id_and_seed(tmp_path):
    def build(dataset: Shards) -> DataLoader:
        generator = torch.Generator().manual_seed(3)
        return _loader(dataset, 2, "fork", generator=generator, worker_init_fn=note_worker)

    def facts(batches) -> list[list[list[int]]]:
        return [[column.tolist() for column in batch] for batch in batches]

    plain = facts(build(ShardsWithWorkerFacts()))
    with guard(build(ShardsWithWorkerFacts(at=13, marker_dir=tmp_path)), stall_timeout=QUICK) as guarded:
        assert facts(guarded) == plain
        # Worker 0 of the new iterator continued stream 1: it was worker 1 to the dataset, its seed and init.
        assert guarded.events[-1].detail["streams"]["first"] == 1
    # What it was told, as the plain loader tells worker 1: not worker 0's.
    for items, ids, seeds, torch_seeds, inits in plain[1::2]:
        assert ids == inits == [1] * len(items) and seeds == torch_seeds == [plain[0][2][0] + 1] * len(items)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # 3 on 2 cores: it is fine
@pytest.mark.parametrize(("workers", "at", "batch"), [(2, 26, 4), (3, 29, 6)])
def test_a_stream_that_had_ended_stays_ended_after_a_restart(tmp_path, workers, at, batch):
    # Worker 1's stream is one batch. A worker hangs at `at`, in the epoch's batch `batch`: after worker 1 ended,
    # and just after a batch of worker 0.
    shards = {"short_worker": 1, "short_below": 8}
    plain = _plain_epoch(workers, **shards)
    if workers == 3:
        # In rounds: each worker's next batch in turn, a stream that ended left out.
        assert plain == [
            [0, 3, 6, 9],
            [1, 4, 7],
            [2, 5, 8, 11],
            [12, 15, 18, 21],
            [14, 17, 20, 23],
            [24, 27, 30, 33],
            [26, 29, 32, 35],
            [36, 39],
            [38],
        ]
    dataset = Shards(at=at, marker_dir=tmp_path, **shards)
    with guard(_loader(dataset, workers, "fork"), stall_timeout=QUICK) as guarded:
        got = _run(guarded, 2)
        assert got == [plain] * 2
        assert _kinds(guarded) == ["stall", "restart"]
        restart = guarded.events[-1]
        # The last batch delivered came from worker 0: worker 0 of the new iterator continues stream 1, which
        # yields nothing from its saved end, and the others deal on in turn.
        assert restart.batch == batch and restart.detail["streams"] == {"resumed": list(range(workers)), "first": 1}


def test_past_the_start_methods_two_workers_give_up_since_their_streams_cannot_merge(tmp_path):
    dataset = Shards(at=13, marker_dir=tmp_path, once=False)
    with guard(_loader(dataset, 2, "spawn"), stall_timeout=QUICK) as guarded:
        batches = []
        with pytest.raises(LoaderDoctorError) as raised:
            batches.extend(b.tolist() for b in guarded)
        assert batches == _plain_epoch(2)[:3]
        assert _kinds(guarded) == ["stall"]
    message = raised.value.message
    assert "gave up at epoch 0, batch 3: a stall, after 0 restarts (max_restarts=3)" in message
    assert "No rung is left: an IterableDataset's workers each iterate their own stream" in message


def test_a_single_workers_stream_moves_to_the_main_process(tmp_path):
    dataset = Shards(at=13, marker_dir=tmp_path, once=False)  # hangs in every worker, never in the main process
    with guard(_loader(dataset, 1, "spawn"), stall_timeout=QUICK) as guarded:
        assert _run(guarded, 2) == [_plain_epoch(0)] * 2
        assert _kinds(guarded) == ["stall", "restart"]
        restart = guarded.events[-1]
        assert restart.detail["after"]["num_workers"] == 0 and restart.detail["streams"]["resumed"] == [0]


def test_a_main_process_hang_moves_the_stream_to_a_spawned_worker(tmp_path):
    dataset = Shards(at=13, marker_dir=tmp_path, in_main=True)
    with guard(_loader(dataset, 0), stall_timeout=QUICK) as guarded:
        assert _run(guarded, 2) == [_plain_epoch(0)] * 2
        assert _kinds(guarded) == ["stall", "restart"]
        stall, restart = guarded.events
        assert stall.batch == 3 and stall.detail["pids"] == [] and "interrupting it" in stall.message
        assert restart.detail["escalated"] and restart.detail["streams"] == {"resumed": [0], "first": 0}
        assert (restart.detail["after"]["num_workers"], restart.detail["after"]["start_method"]) == (1, "spawn")
        assert guarded.settings.num_workers == 1 and not guarded.settings.persistent_workers


def test_a_state_saved_from_two_workers_mid_epoch_resumes_in_a_new_loader():
    def build() -> DataLoader:
        return _loader(Shards(), 2, "fork", persistent_workers=True)

    with guard(build()) as first:
        got = _run(first, 1)
        iterator = iter(first)
        got.append([next(iterator).tolist() for _ in range(5)])
        state = json.loads(json.dumps(first.state_dict()))
    assert state["worker_states"] == {"0": {"position": 12}, "1": {"position": 8}} and state["last_worker"] == 0
    with guard(build()) as resumed:
        resumed.load_state_dict(state)
        got[1] += _run(resumed, 1)[0]
        got += _run(resumed, 1)
        assert resumed.events == [e for e in resumed.events if e.kind == "setting-changed"]
    assert got == [_plain_epoch(2)] * 3
