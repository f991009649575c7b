"""The guard's decisions on a failure, as pure functions: its kind, and the settings of the next restart."""

from __future__ import annotations

from torch._utils import ExceptionWrapper

from loaderdoctor.guard.children import GuardInterrupt
from loaderdoctor.guard.recovery import (
    ASK_WORKERS,
    DIED,
    STALL,
    USERS_TIMEOUT,
    FailureFacts,
    choose_rung,
    classify,
    death_cause,
    is_users_timeout,
)
from loaderdoctor.loader.settings import Settings
from loaderdoctor.tap.iterator import raised_in_worker


def _facts(**changes) -> FailureFacts:
    values = {"num_workers": 2, "stalled": False, "died": None, "users_timeout_s": 0.0, "exited": [], "waited_s": 0.1}
    return FailureFacts(**{**values, **changes})


def _reraised_by_torch(error: Exception) -> Exception:
    """`error` as torch re-raises a dataset's exception from a worker in the main process."""
    try:
        raise error
    except Exception:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
    try:
        wrapper.reraise()
    except Exception as reraised:
        return reraised
    raise AssertionError("reraise() raised nothing")


def test_a_failure_is_a_stall_a_death_the_users_or_a_question_for_the_workers():
    assert classify(GuardInterrupt("ended"), _facts()) == STALL
    assert classify(ValueError("anything"), _facts(stalled=True)) == STALL
    assert classify(RuntimeError("any words"), _facts(exited=[11])) == DIED
    assert classify(EOFError(), _facts(exited=[11])) == DIED
    assert classify(EOFError(), _facts(died="worker 11 died")) == DIED
    assert classify(ConnectionResetError(), _facts()) == ASK_WORKERS
    assert classify(ValueError("bad sample"), _facts(num_workers=0)) is None


def test_decisions_never_read_the_words_of_an_error():
    # torch's words for a death, with every worker of this loader alive (another loader's worker died): not ours.
    assert classify(RuntimeError("DataLoader worker (pid 11) is killed by signal: Killed."), _facts()) == ASK_WORKERS
    # The dataset's own error, re-raised by torch from a worker, is the user's: by where it was raised.
    from_worker = _reraised_by_torch(ValueError("bad sample"))
    assert raised_in_worker(from_worker) and isinstance(from_worker, ValueError)
    assert classify(from_worker, _facts()) is None
    assert classify(from_worker, _facts(exited=[11])) is None
    # The same words raised elsewhere are not the dataset's.
    words = ValueError("Caught ValueError in DataLoader worker process 0.")
    assert not raised_in_worker(words)
    assert classify(words, _facts()) == ASK_WORKERS


def test_the_users_own_timeout_is_theirs_to_see():
    timed_out = RuntimeError("DataLoader timed out after 5 seconds")
    assert is_users_timeout(timed_out, _facts(users_timeout_s=5.0, waited_s=5.01))
    assert classify(timed_out, _facts(users_timeout_s=5.0, waited_s=5.01)) == USERS_TIMEOUT
    assert not is_users_timeout(timed_out, _facts(num_workers=0, users_timeout_s=5.0, waited_s=5.01))
    # Told by the clock, not the words: an error before the timeout passed, or with a worker dead, is not it.
    assert not is_users_timeout(timed_out, _facts(users_timeout_s=5.0, waited_s=0.2))
    assert classify(timed_out, _facts(users_timeout_s=5.0, waited_s=5.01, exited=[11])) == DIED


def test_a_deaths_cause_is_torchs_report_or_the_error_it_showed_as():
    report = RuntimeError("DataLoader worker (pid 11) is killed by signal: Killed.")
    assert death_cause(report, None) == str(report)
    assert death_cause(report, "seen by the handler") == "seen by the handler"
    assert death_cause(None, "worker 11 died") == "worker 11 died (seen between batches)"
    assert death_cause(EOFError("gone"), None) == "EOFError: gone"


def _never() -> bool:
    raise AssertionError("picklable() must not be asked here")


def test_the_next_rung_comes_from_the_ladder_while_restarts_are_left():
    failed = Settings(num_workers=2, start_method="fork")
    rung = choose_rung(
        failed,
        STALL,
        restarts_left=True,
        escalated=False,
        tried=[failed],
        picklable=lambda: True,
        per_worker_streams=False,
    )
    assert rung is not None and rung.settings.start_method == "forkserver" and rung.why == ""
    assert (
        choose_rung(
            failed,
            STALL,
            restarts_left=False,
            escalated=False,
            tried=[failed],
            picklable=_never,
            per_worker_streams=False,
        )
        is None
    )
    spawned = Settings(num_workers=2, start_method="spawn")
    assert choose_rung(
        spawned, DIED, restarts_left=True, escalated=False, tried=[], picklable=_never, per_worker_streams=False
    ).settings == Settings(num_workers=1, start_method="spawn")


def test_after_a_death_on_a_sample_now_skipped_the_settings_stay():
    failed = Settings(num_workers=2, start_method="fork")
    common = {"escalated": True, "tried": [failed], "picklable": _never, "per_worker_streams": False}
    rung = choose_rung(failed, DIED, restarts_left=True, killer_skipped=5, **common)
    assert rung is not None and rung.settings == failed and "dataset index 5" in rung.why
    assert choose_rung(failed, DIED, restarts_left=False, killer_skipped=5, **common) is None  # restarts still count


def test_a_death_with_no_safer_rung_starts_the_same_workers_again_once():
    # One forked worker of a dataset only forked workers can load (a script without `if __name__ == "__main__":`):
    # no start method or worker count is left to change; a death may be the machine's, so one more try as it was.
    failed = Settings(num_workers=1, start_method="fork")
    common = {"escalated": False, "tried": [failed], "picklable": lambda: False, "per_worker_streams": False}
    again = choose_rung(failed, DIED, restarts_left=True, **common)
    assert again is not None and again.settings == failed and "start again as they were, once" in again.why
    assert choose_rung(failed, DIED, restarts_left=True, retried_as_was=True, **common) is None
    assert choose_rung(failed, STALL, restarts_left=True, **common).settings.num_workers == 0  # a stall's own rung


def test_a_main_process_stall_moves_once_to_one_spawned_worker():
    main = Settings(num_workers=0)
    up = choose_rung(
        main, STALL, restarts_left=True, escalated=False, tried=[main], picklable=lambda: True, per_worker_streams=False
    )
    assert up.settings.num_workers == 1 and up.settings.start_method == "spawn" and "the last rung" in up.why
    stays = choose_rung(
        main,
        STALL,
        restarts_left=True,
        escalated=False,
        tried=[main],
        picklable=lambda: False,
        per_worker_streams=False,
    )
    assert stays.settings == main and "cannot be sent to a worker" in stays.why
    came_down = [Settings(num_workers=1, start_method="spawn"), main]
    assert (
        choose_rung(
            main,
            STALL,
            restarts_left=True,
            escalated=False,
            tried=came_down,
            picklable=lambda: True,
            per_worker_streams=False,
        )
        is None
    )
    assert (
        choose_rung(
            main, STALL, restarts_left=True, escalated=True, tried=[main], picklable=_never, per_worker_streams=False
        )
        is None
    )
