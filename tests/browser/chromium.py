"""Open one local HTML file in headless Chromium (devtools.py drives it) and tell what it drew, reported and asked
the network for. Every wait has a deadline; chromium ends whatever happens, its profile folder removed.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from devtools import Browser, BrowserError

INSTALL_HINT = "chromium is not installed: apt-get install chromium"

_VIEWPORT_HEIGHT = 800
_MAX_SCREENSHOT_HEIGHT = 16384

# One rendered frame and the tasks queued by then (late script errors, fetches started on load), at most 500 ms.
_SETTLE = "new Promise(done => { requestAnimationFrame(() => setTimeout(done, 0)); setTimeout(done, 500); })"
_DRAWN = """({
    svg_count: document.querySelectorAll('svg').length,
    canvas_count: document.querySelectorAll('canvas').length,
    text: document.body ? document.body.innerText : '',
})"""
_PAGE_HEIGHT = "Math.ceil(Math.max(document.documentElement.scrollHeight, document.body?.scrollHeight ?? 0))"


class ChromiumMissing(RuntimeError):
    """No chromium binary on PATH."""


@dataclass(frozen=True)
class PageResult:
    """What one page did in headless Chromium: what it drew, what went wrong, and what it asked the network for."""

    url: str
    svg_count: int
    canvas_count: int
    # Uncaught exceptions and unhandled promise rejections, one line each.
    exceptions: list[str]
    # console.error calls and the browser's own error messages (a Content-Security-Policy violation is one).
    console_errors: list[str]
    # URLs of every request other than the page's own file and data: URLs, blocked or not.
    outside_requests: list[str]
    # document.body.innerText: what a reader sees as text.
    text: str
    # The value of each named expression given to open_page.
    values: dict[str, Any] = field(default_factory=dict)
    screenshot: Path | None = None
    open_s: float = 0.0

    @property
    def errors(self) -> list[str]:
        """Every exception and console error, exceptions first."""
        return [*self.exceptions, *self.console_errors]


def find_chromium() -> str:
    """The path of the chromium binary on PATH; raises ChromiumMissing naming the package to install."""
    binary = shutil.which("chromium")
    if binary is None:
        raise ChromiumMissing(INSTALL_HINT)
    return binary


def open_page(
    path: Path,
    *,
    timeout_s: float = 30.0,
    screenshot: Path | None = None,
    width: int = 1200,
    color_scheme: Literal["light", "dark"] | None = None,
    media: Literal["screen", "print"] | None = None,
    expressions: dict[str, str] | None = None,
    binary: str | None = None,
) -> PageResult:
    """Load the HTML file at path in a fresh headless Chromium and return what it drew, reported and requested.

    color_scheme emulates prefers-color-scheme, media emulates print or screen media. expressions are JavaScript
    expressions evaluated in the loaded page (promises awaited); their values come back under the same names.
    screenshot, when given, receives a PNG of the whole page at the given width. Raises TimeoutError when the whole
    of it takes longer than timeout_s.
    """
    binary = binary or find_chromium()
    page_url = Path(path).resolve().as_uri()
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="loaderdoctor-chromium-") as profile_dir,
        Browser(binary, Path(profile_dir), deadline=started + timeout_s) as browser,
    ):
        session = _open_tab(browser, width)
        media_features = [{"name": "prefers-color-scheme", "value": color_scheme}] if color_scheme else []
        browser.call("Emulation.setEmulatedMedia", {"media": media or "", "features": media_features}, session)
        _navigate(browser, session, page_url)
        _evaluate(browser, session, _SETTLE)
        drawn = _evaluate(browser, session, _DRAWN)
        values = {name: _evaluate(browser, session, expression) for name, expression in (expressions or {}).items()}
        if screenshot is not None:
            _capture(browser, session, width, screenshot)
        exceptions, console_errors, outside_requests = _reported(browser.events, session, page_url)
        return PageResult(
            url=page_url,
            svg_count=drawn["svg_count"],
            canvas_count=drawn["canvas_count"],
            exceptions=exceptions,
            console_errors=console_errors,
            outside_requests=outside_requests,
            text=drawn["text"],
            values=values,
            screenshot=screenshot,
            open_s=time.monotonic() - started,
        )


def _open_tab(browser: Browser, width: int) -> str:
    """A new tab with a viewport width pixels wide and its page, console and network events on; its session id."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})
    session = browser.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.call(f"{domain}.enable", {}, session)
    metrics = {"width": width, "height": _VIEWPORT_HEIGHT, "deviceScaleFactor": 1, "mobile": False}
    browser.call("Emulation.setDeviceMetricsOverride", metrics, session)
    return session


def _navigate(browser: Browser, session: str, url: str) -> None:
    """Navigate the tab to url and return once its load event fired."""
    first_event = len(browser.events)
    navigation = browser.call("Page.navigate", {"url": url}, session)
    if "errorText" in navigation:
        raise BrowserError(f"chromium could not open {url}: {navigation['errorText']}")
    browser.wait_for_event("Page.loadEventFired", session, first_event)


def _evaluate(browser: Browser, session: str, expression: str) -> Any:
    """The value of a JavaScript expression in the page, a promise awaited; raises BrowserError when it throws."""
    params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
    answer = browser.call("Runtime.evaluate", params, session)
    if "exceptionDetails" in answer:
        raise BrowserError(f"{expression!r} failed in the page: {_exception_line(answer['exceptionDetails'])}")
    return answer["result"].get("value")


def _capture(browser: Browser, session: str, width: int, destination: Path) -> None:
    """Write a PNG of the whole page, as tall as its content (at most 16384 pixels), to destination."""
    height = min(max(int(_evaluate(browser, session, _PAGE_HEIGHT) or 0), 1), _MAX_SCREENSHOT_HEIGHT)
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
    browser.call("Emulation.setDeviceMetricsOverride", metrics, session)
    shot = browser.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session)
    destination.write_bytes(base64.b64decode(shot["data"]))


def _reported(events: list[dict], session: str, page_url: str) -> tuple[list[str], list[str], list[str]]:
    """The tab's uncaught exceptions, console errors and outside requests, in the order they happened."""
    exceptions: list[str] = []
    console_errors: list[str] = []
    outside_requests: list[str] = []
    own_url = urllib.parse.unquote(page_url)
    for event in events:
        if event.get("sessionId") != session:
            continue
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            exceptions.append(_exception_line(params["exceptionDetails"]))
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            console_errors.append(" ".join(_remote_text(arg) for arg in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            console_errors.append(f"{entry['text']} ({entry['url']})" if entry.get("url") else entry["text"])
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith("data:") and urllib.parse.unquote(url.split("#")[0]) != own_url:
                outside_requests.append(url)
    return exceptions, console_errors, outside_requests


def _exception_line(details: dict) -> str:
    """One line for a DevTools exceptionDetails: its text, the exception's first line and where it was thrown."""
    description = details.get("exception", {}).get("description", "")
    line = " ".join(filter(None, [details.get("text", ""), description.splitlines()[0] if description else ""]))
    if details.get("url"):
        line += f" ({details['url']}:{details.get('lineNumber', 0) + 1})"
    return line


def _remote_text(remote_object: dict) -> str:
    """How the console would print one DevTools RemoteObject argument."""
    if "value" in remote_object:
        return str(remote_object["value"])
    return remote_object.get("description", remote_object.get("type", ""))
