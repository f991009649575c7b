"""A window's warm-up drains the batches prefetched during a pause, on hand-fed batches: it goes on until a batch
waits in next() (the loop has caught up with the workers), and no further than its cap."""

from __future__ import annotations

import types

from loaderdoctor.loader.settings import Settings
from loaderdoctor.probe.session import BACKLOG_ROUNDS, CAUGHT_UP_SHARE, ProbeSession
from loaderdoctor.recording.record import BatchRecord

STEP_S = 0.02


def _session(waits: list[float], *, workers: int = 2, step: object = object()) -> ProbeSession:
    """A ProbeSession whose _roll delivers the next of `waits`, one batch a call, each followed by a 20 ms step."""
    session = ProbeSession.__new__(ProbeSession)
    session.step = step
    session.settings = Settings(num_workers=workers, persistent_workers=bool(workers))
    session.rec = types.SimpleNamespace(batches=[])
    session.clock = lambda: 0.0
    pending = list(waits)

    def roll(**_: object) -> None:
        if pending:
            index = len(session.rec.batches) + 1  # no epoch's first batch here
            session.rec.batches.append(BatchRecord(0, index, pending.pop(0), 0.0, STEP_S, 1, 1))

    session._roll = roll
    return session


def test_the_warm_up_goes_on_until_a_batch_waits():
    waits = [0.0, 0.0001, 0.0, 0.0005, CAUGHT_UP_SHARE * STEP_S, 0.0, 0.0]
    session = _session(waits)
    session._drain_backlog(give_up=1.0, epochs=None)
    assert len(session.rec.batches) == 5  # the fifth waited: the backlog is gone


def test_a_loader_that_keeps_up_is_drained_no_further_than_the_cap():
    session = _session([0.0] * 100)
    session._drain_backlog(give_up=1.0, epochs=None)
    assert len(session.rec.batches) == BACKLOG_ROUNDS * session.settings.batches_in_flight


def test_without_workers_or_a_step_there_is_nothing_to_drain():
    for session in (_session([0.0] * 10, workers=0), _session([0.0] * 10, step=None)):
        session._drain_backlog(give_up=1.0, epochs=None)
        assert session.rec.batches == []
