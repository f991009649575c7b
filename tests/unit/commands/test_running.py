"""commands/running.kept: a run stopped by Ctrl-C or SIGTERM keeps what it measured, as `run` keeps a stopped
script's; a stop before anything was measured keeps nothing."""

from __future__ import annotations

import pytest

from loaderdoctor.commands import running
from loaderdoctor.errors import StoppedByUser, Terminated
from loaderdoctor.report import Report


@pytest.fixture
def kept_reports(monkeypatch):
    kept: list[tuple[str, object]] = []
    monkeypatch.setattr(running, "keep_report", lambda kind, report, *rest: kept.append((kind, report)))
    return kept


def test_a_stopped_check_keeps_its_partial_report_and_the_stop_goes_on(kept_reports):
    partial = Report("demo", {"train": object()})  # type: ignore[dict-item]  # kept as it is, not looked into

    def stopped() -> Report:
        try:
            raise Terminated(15)
        except Terminated:
            raise StoppedByUser(partial) from None

    with pytest.raises(StoppedByUser) as stop:
        running.kept("check", True, stopped)
    assert stop.value.partial is partial
    assert kept_reports == [("check", partial)]


def test_nothing_is_kept_when_nothing_was_measured_or_history_is_off(kept_reports):
    def empty() -> Report:
        raise StoppedByUser(Report("demo", {}))

    with pytest.raises(StoppedByUser):
        running.kept("check", True, empty)
    with pytest.raises(StoppedByUser):
        running.kept("check", False, lambda: (_ for _ in ()).throw(StoppedByUser(Report("d", {"a": object()}))))
    assert kept_reports == []


def test_a_stop_says_in_its_message_where_the_partial_report_is():
    stop = StoppedByUser(Report("d", {}))
    assert "partial" in str(stop) and stop.partial is not None and isinstance(stop, KeyboardInterrupt)
    assert str(StoppedByUser()) == "stopped before anything was measured"
