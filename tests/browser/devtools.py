"""A headless Chromium driven over the DevTools protocol on a pipe: commands, their answers, the events between.

Chromium started with --remote-debugging-pipe reads commands on fd 3 and writes answers and events on fd 4: JSON
messages, each ended by a NUL byte. Every wait has a deadline, and chromium with every process it started is ended
whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

# What chromium needs to run headless as root in a container, and what stops it from contacting the network on its
# own (updates, metrics, safe browsing, translation...). The proxy on a closed local port makes any http(s) or ws
# request that is still made fail at once instead of leaving the machine; the page's attempts are still reported.
_FLAGS = (
    "--headless=new",
    "--remote-debugging-pipe",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--metrics-recording-only",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-pings",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--disable-crash-reporter",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--password-store=basic",
    "--use-mock-keychain",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-color-profile=srgb",
)

# Popen hands chromium's pipe ends over as stdin and stdout; this moves them to the 3 and 4 chromium reads and
# writes (dash redirects single-digit descriptors only), sends its own output to the log, then becomes chromium.
_MOVE_PIPE_FDS = 'exec "$@" 3<&0 4>&1 0</dev/null 1>&2'

_CLOSE_GRACE_S = 3.0
_KILL_WAIT_S = 5.0
_LOG_TAIL_CHARS = 2000


class BrowserError(RuntimeError):
    """Chromium exited, refused a command, or an expression failed in the page."""


class Browser:
    """A running headless Chromium with its DevTools pipe: commands, their answers, and the events in between.

    Every wait ends by the deadline given at start. close() (or leaving the with block) ends chromium and every
    process it started.
    """

    def __init__(self, binary: str, profile_dir: Path, *, deadline: float) -> None:
        self.deadline = deadline
        self.events: list[dict] = []
        self._profile_dir = profile_dir
        self._log_path = profile_dir / "chromium.log"
        self._next_id = 0
        self._received = b""
        commands_read, self._commands = os.pipe()
        self._answers, answers_write = os.pipe()
        os.set_blocking(self._commands, False)
        home = str(profile_dir)
        try:
            with open(self._log_path, "wb") as log:
                self._process = subprocess.Popen(
                    [
                        "/bin/sh",
                        "-c",
                        _MOVE_PIPE_FDS,
                        "sh",
                        binary,
                        *_FLAGS,
                        f"--user-data-dir={profile_dir / 'profile'}",
                        "about:blank",
                    ],
                    stdin=commands_read,
                    stdout=answers_write,
                    stderr=log,
                    # Its own process group, so that close() can end chromium's helpers with it.
                    start_new_session=True,
                    # What chromium writes outside --user-data-dir (~/.pki, caches) goes to the folder removed after.
                    env={**os.environ, "HOME": home, "XDG_CONFIG_HOME": home, "XDG_CACHE_HOME": home},
                )
        except BaseException:
            for fd in (self._commands, self._answers):
                os.close(fd)
            raise
        finally:
            os.close(commands_read)
            os.close(answers_write)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one DevTools command and return its result, keeping the events that arrive meanwhile."""
        self._next_id += 1
        command_id = self._next_id
        message: dict[str, Any] = {"id": command_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._send(json.dumps(message).encode() + b"\0", method)
        while True:
            answer = self._receive(method)
            if "method" in answer:
                self.events.append(answer)
            elif answer.get("id") == command_id:
                if "error" in answer:
                    raise BrowserError(f"chromium refused {method}: {answer['error'].get('message')}")
                return answer.get("result", {})

    def wait_for_event(self, method: str, session: str, first: int) -> dict:
        """The first event named method from the session at or after index first of events, waiting for it."""
        seen = first
        while True:
            for event in self.events[seen:]:
                if event["method"] == method and event.get("sessionId") == session:
                    return event
            seen = len(self.events)
            message = self._receive(method)
            if "method" in message:
                self.events.append(message)

    def close(self) -> None:
        """End chromium and every process it started, and close the pipe; waits at most a few seconds."""
        try:
            if not _exited(self._process.pid):
                # A polite close first, so chromium ends its helpers itself; it may be too busy to answer.
                with contextlib.suppress(OSError, TimeoutError):
                    self._send(b'{"id": 0, "method": "Browser.close"}\0', "Browser.close", grace_s=0.5)
                deadline = time.monotonic() + _CLOSE_GRACE_S
                while not _exited(self._process.pid) and time.monotonic() < deadline:
                    time.sleep(0.02)
            with contextlib.suppress(ProcessLookupError):
                # Still the group's id: the leader is not reaped yet, so this cannot reach a stranger.
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=_KILL_WAIT_S)
            _end_leftovers(self._process.pid, self._profile_dir)
        finally:
            for fd in (self._commands, self._answers):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _send(self, message: bytes, waiting_for: str, grace_s: float | None = None) -> None:
        """Write one message to chromium's command pipe, by the deadline (or within grace_s)."""
        deadline = self.deadline if grace_s is None else time.monotonic() + grace_s
        view = memoryview(message)
        while view:
            _, writable, _ = select.select([], [self._commands], [], max(deadline - time.monotonic(), 0))
            if not writable:
                raise self._timeout(f"did not take the command {waiting_for}")
            view = view[os.write(self._commands, view) :]

    def _receive(self, waiting_for: str) -> dict:
        """The next message from chromium, by the deadline; raises BrowserError when chromium closed its end."""
        while b"\0" not in self._received:
            readable, _, _ = select.select([self._answers], [], [], max(self.deadline - time.monotonic(), 0))
            if not readable:
                raise self._timeout(f"did not answer {waiting_for}")
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited waiting for {waiting_for}; its log ends:\n{self._log_tail()}")
            self._received += chunk
        message, self._received = self._received.split(b"\0", 1)
        return json.loads(message)

    def _timeout(self, what: str) -> TimeoutError:
        return TimeoutError(f"chromium {what} by its deadline; its log ends:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self._log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
        return ""


def _exited(pid: int) -> bool:
    """Whether the child pid has exited, leaving it unreaped: its process group id stays reserved until it is."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _end_leftovers(group: int, profile_dir: Path) -> None:
    """Kill what is left of chromium and wait until it is gone.

    That is its process group, and the crash handler Debian's build starts whatever the flags say: it runs in a
    session of its own, found by the temporary folder in its command line.
    """
    deadline = time.monotonic() + _KILL_WAIT_S
    while leftovers := _chromium_processes(group, str(profile_dir)):
        if time.monotonic() > deadline:
            raise BrowserError(f"chromium left processes {leftovers} that SIGKILL did not end")
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _chromium_processes(group: int, profile_dir: str) -> list[int]:
    """Live (not zombie) processes in the process group, or whose command line names the profile folder."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            # The command name in stat may hold spaces and parentheses: the fields that follow the last ')' are fixed.
            state, _parent, process_group = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            if state == "Z":
                continue
            if int(process_group) == group or profile_dir in (proc / "cmdline").read_text(errors="replace"):
                found.append(int(proc.name))
    return found
