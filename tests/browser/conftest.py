"""The one gate of the browser tests: skip where chromium is missing, fail instead where CI requires the browser."""

from __future__ import annotations

import os

import pytest
from chromium import ChromiumMissing, find_chromium

# CI sets it (.ci/run), so that a missing browser fails the run instead of skipping what it was meant to test.
REQUIRE_BROWSER = "LOADERDOCTOR_REQUIRE_BROWSER"


@pytest.fixture(scope="session")
def chromium() -> str:
    """The chromium binary's path: skips the test where there is none, fails it where LOADERDOCTOR_REQUIRE_BROWSER=1."""
    try:
        return find_chromium()
    except ChromiumMissing as missing:
        if os.environ.get(REQUIRE_BROWSER) == "1":
            pytest.fail(f"{missing} ({REQUIRE_BROWSER}=1 requires it)")
        pytest.skip(str(missing))
