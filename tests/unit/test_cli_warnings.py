"""How the command line shows loaderdoctor's warnings and log (one line each, control characters visible, Python's
own showwarning put back after), and Ctrl-C held while it starts (startup.py)."""

from __future__ import annotations

import logging
import signal
import sys
import warnings

import pytest

from loaderdoctor import startup
from loaderdoctor.cli import _warnings_as_log_lines, main
from loaderdoctor.history.store import HistoryWarning
from loaderdoctor.render.terminal import VisibleFormatter
from loaderdoctor.tap import signals

CLEAR = "\x1b[2J"


def test_log_lines_show_control_characters_as_escapes():
    record = logging.LogRecord("loaderdoctor", logging.WARNING, __file__, 1, "loader %s failed", (f"val{CLEAR}",), None)
    line = VisibleFormatter("loaderdoctor: %(levelname)s: %(message)s").format(record)
    assert line == "loaderdoctor: WARNING: loader val\\x1b[2J failed"


def test_loaderdoctor_warnings_become_one_log_line_and_others_pass_on(monkeypatch, caplog):
    shown = []
    previous = lambda message, category, *where, **more: shown.append((str(message), category))  # noqa: E731
    monkeypatch.setattr(warnings, "showwarning", previous)
    restore = _warnings_as_log_lines()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(f"did not save{CLEAR}:\n  hint: set it", HistoryWarning, stacklevel=1)
        warnings.warn("a script's own", DeprecationWarning, stacklevel=1)
    restore()
    assert warnings.showwarning is previous
    logged = [r.getMessage() for r in caplog.records if r.name == "loaderdoctor"]
    assert logged == [f"did not save{CLEAR}: hint: set it"]  # one line; made visible by the log's formatter
    assert shown == [("a script's own", DeprecationWarning)]


def test_main_puts_showwarning_back_when_the_command_ends(capsys):
    before = warnings.showwarning
    assert main(["scenarios"]) == 0
    assert warnings.showwarning is before


def test_the_command_line_is_the_console_script_or_python_m_loaderdoctor(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/venv/bin/loaderdoctor", "tune"])
    assert startup.is_command_line()
    monkeypatch.setattr(sys, "argv", ["-m"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "loaderdoctor", "tune"])
    assert startup.is_command_line()
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "torch.distributed.run", "train.py"])
    assert not startup.is_command_line()
    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "loaderdoctor"])
    monkeypatch.setattr(sys, "orig_argv", ["python", "train.py", "-m", "loaderdoctor"])
    assert not startup.is_command_line()


def test_ctrl_c_while_held_is_recorded_a_burst_is_one_press_and_one_after_a_pause_raises(monkeypatch):
    monkeypatch.setattr(startup, "is_command_line", lambda: True)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    startup.hold_interrupt()
    try:
        for _ in range(3):  # pressed three times fast: held, nothing raised
            signal.raise_signal(signal.SIGINT)
        assert startup.release_interrupt() is True
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert startup.release_interrupt() is False  # once
        startup.hold_interrupt()
        signal.raise_signal(signal.SIGINT)
        monkeypatch.setattr(signals, "PRESS_BURST_S", 0.0)  # the next press comes after a pause
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # the user insists
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        startup.release_interrupt()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_library_import_holds_nothing(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py"])
    startup.hold_interrupt()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert startup.release_interrupt() is False
