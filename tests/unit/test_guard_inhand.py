"""The slots where workers say which dataset index they are loading (guard/inhand.py)."""

from __future__ import annotations

import pickle

import pytest
from torch.utils.data._utils import worker as torch_worker

from loaderdoctor.guard.inhand import InHand


@pytest.fixture
def as_worker(monkeypatch):
    """Runs the test body as if in worker `id` of 3 (torch's get_worker_info())."""

    def become(worker_id: int) -> None:
        info = torch_worker.WorkerInfo(id=worker_id, num_workers=3, seed=0, dataset=None)
        monkeypatch.setattr(torch_worker, "_worker_info", info)

    return become


def test_a_worker_writes_its_own_slot_and_the_main_process_reads_it(tmp_path, as_worker):
    slots = InHand(str(tmp_path), 3)
    assert [slots.read(i) for i in range(3)] == [None, None, None]
    in_worker = pickle.loads(pickle.dumps(slots))  # only the path travels
    as_worker(1)
    in_worker.loading(123_456_789_012)
    assert [slots.read(i) for i in range(3)] == [None, 123_456_789_012, None]
    in_worker.done()
    assert slots.read(1) is None
    in_worker.loading("a key, not an index")  # nothing to name: the slot says none
    assert slots.read(1) is None


def test_the_main_process_keeps_no_slot(tmp_path):
    slots = InHand(str(tmp_path), 2)
    slots.loading(7)  # no worker: nothing written, nothing mapped
    assert slots.read(0) is None and slots.read(1) is None
    assert slots.read(5) is None  # past the slots
