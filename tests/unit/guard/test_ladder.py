"""The fallback ladder and the safe settings, as pure functions of Settings and host facts."""

from __future__ import annotations

import pytest

from loaderdoctor.guard.ladder import escalation, next_rung
from loaderdoctor.guard.safe import persistent_workers_change, start_method_change
from loaderdoctor.host.forkhazards import ForkHazards
from loaderdoctor.loader.settings import Settings
from loaderdoctor.recording.record import AliveThread, IteratorFacts


def _walk(settings: Settings, **kwargs) -> list[tuple[int, str | None]]:
    rungs = []
    current: Settings | None = settings
    while (current := next_rung(current, "stall", **kwargs)) is not None:
        rungs.append((current.num_workers, current.start_method))
    return rungs


def test_the_ladder_goes_to_safer_start_methods_then_fewer_workers_then_none():
    assert _walk(Settings(num_workers=4, start_method="fork", persistent_workers=True)) == [
        (4, "forkserver"),
        (4, "spawn"),
        (2, "spawn"),
        (1, "spawn"),
        (0, None),
    ]


def test_the_ladder_starts_where_the_settings_are():
    assert _walk(Settings(num_workers=3, start_method="spawn")) == [(1, "spawn"), (0, None)]
    assert _walk(Settings(num_workers=0)) == []


def test_workers_that_cannot_be_pickled_keep_their_start_method():
    assert _walk(Settings(num_workers=2, start_method="fork"), picklable=False) == [(1, "fork"), (0, None)]


def test_a_rung_keeps_the_other_settings():
    rung = next_rung(Settings(num_workers=2, start_method="fork", persistent_workers=True, prefetch_factor=4), "stall")
    assert rung == Settings(num_workers=2, start_method="forkserver", persistent_workers=True, prefetch_factor=4)
    assert next_rung(Settings(num_workers=1, start_method="spawn", persistent_workers=True), "stall") == (
        Settings(num_workers=0)
    )


def test_after_a_worker_died_loading_never_comes_into_the_main_process():
    # A sample that segfaults or exhausts memory would end the training process there.
    died = [(s.num_workers, s.start_method) for s in _walk_died(Settings(num_workers=2, start_method="fork"))]
    assert died == [(2, "forkserver"), (2, "spawn"), (1, "spawn")]
    assert next_rung(Settings(num_workers=1, start_method="spawn"), "worker-died") is None
    assert next_rung(Settings(num_workers=1, start_method="fork"), "worker-died", picklable=False) is None


def _walk_died(settings: Settings) -> list[Settings]:
    rungs = []
    while (settings := next_rung(settings, "worker-died")) is not None:
        rungs.append(settings)
    return rungs


def test_per_worker_streams_keep_their_number_of_workers_but_one_goes_to_the_main_process():
    assert _walk(Settings(num_workers=2, start_method="fork"), per_worker_streams=True) == [
        (2, "forkserver"),
        (2, "spawn"),
    ]
    assert _walk(Settings(num_workers=1, start_method="fork"), per_worker_streams=True) == [
        (1, "forkserver"),
        (1, "spawn"),
        (0, None),
    ]
    assert _walk(Settings(num_workers=4, start_method="fork"), per_worker_streams=True, picklable=False) == []


def test_a_main_process_stall_goes_up_to_one_spawned_worker_that_does_not_persist():
    assert escalation(Settings(pin_memory=True)) == Settings(
        num_workers=1, start_method="spawn", persistent_workers=False, pin_memory=True
    )


def test_an_unknown_reason_is_refused():
    with pytest.raises(ValueError, match="unknown failure reason 'oops'"):
        next_rung(Settings(num_workers=2), "oops")


def _hazards(threads=(), cuda=False, compiled=0) -> ForkHazards:
    alive = [AliveThread(name, "") for name in threads]
    return ForkHazards.of([IteratorFacts(0, "fork", alive, cuda, compiled_frames=compiled)])


def test_persistent_workers_unless_the_user_said_false():
    change = persistent_workers_change(Settings(num_workers=2), explicit=False)
    assert change is not None and change.apply(Settings(num_workers=2)).persistent_workers
    assert "persistent_workers=False" in change.reason
    assert persistent_workers_change(Settings(num_workers=2), explicit=True) is None
    assert persistent_workers_change(Settings(num_workers=0), explicit=False) is None
    assert persistent_workers_change(Settings(num_workers=2, persistent_workers=True), explicit=False) is None


def test_fork_hazards_name_what_runs_in_the_parent():
    assert not _hazards()
    hazards = _hazards(threads=["metrics"], cuda=True, compiled=2)
    assert hazards.describe() == (
        "1 other thread ran (metrics) and CUDA was initialised and torch.compile had compiled 2 functions"
    )


def test_fork_becomes_forkserver_when_unsafe():
    fork = Settings(num_workers=2, start_method="fork")
    change = start_method_change(fork, _hazards(threads=["metrics"]), explicit=False, blocker=None)
    assert change is not None and not change.kept
    assert change.apply(fork).start_method == "forkserver"
    assert "1 other thread ran (metrics)" in change.reason
    assert start_method_change(fork, _hazards(), explicit=False, blocker=None) is None


def test_an_explicit_fork_is_kept_and_said_to_be_unsafe():
    fork = Settings(num_workers=2, start_method="fork")
    change = start_method_change(fork, _hazards(cuda=True), explicit=True, blocker=None)
    assert change is not None and change.kept
    assert change.apply(fork) == fork
    assert "CUDA was initialised" in change.reason and "chosen explicitly" in change.reason


def test_fork_is_kept_where_forkserver_cannot_load_the_loader():
    fork = Settings(num_workers=2)
    blocker = "the loader's collate_fn (function) cannot be pickled"
    change = start_method_change(fork, _hazards(threads=["tqdm_monitor"]), explicit=False, blocker=blocker)
    assert change is not None and change.kept
    assert change.apply(fork) == fork
    assert "tqdm_monitor" in change.reason and blocker in change.reason
    assert "start the loaders' workers before those threads" in change.reason


def test_other_start_methods_and_no_workers_need_no_change():
    hazards = _hazards(threads=["metrics"], cuda=True)
    spawn = Settings(num_workers=2, start_method="spawn")
    assert start_method_change(spawn, hazards, explicit=False, blocker=None) is None
    assert start_method_change(Settings(num_workers=0), hazards, explicit=False, blocker=None) is None
