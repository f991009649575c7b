"""The browser harness can fail: small hand-written pages, each showing one thing it must catch or measure."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from chromium import ChromiumMissing, find_chromium, open_page

# Each page starts its own chromium (a second or two); the mark bounds a hung one beyond open_page's own deadline.
BROWSER_TIMEOUT_S = 90


def _page(tmp_path: Path, body: str, head: str = "") -> Path:
    """An HTML file in tmp_path with the given head and body."""
    page = tmp_path / "page.html"
    page.write_text(f'<!doctype html><html><head><meta charset="utf-8">{head}</head><body>{body}</body></html>')
    return page


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
def test_an_inline_svg_and_a_scripted_canvas_are_counted_with_nothing_reported(chromium, tmp_path):
    page = _page(
        tmp_path,
        '<svg width="120" height="40"><rect width="100" height="20" fill="teal"/></svg>'
        "<script>document.body.appendChild(document.createElement('canvas'));</script>",
    )

    result = open_page(page)

    assert (result.svg_count, result.canvas_count) == (1, 1)
    assert result.errors == []
    assert result.outside_requests == []


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
def test_a_script_that_throws_is_reported(chromium, tmp_path):
    page = _page(tmp_path, "<script>throw new Error('the chart broke');</script>")

    result = open_page(page)

    assert len(result.exceptions) == 1
    assert "Error: the chart broke" in result.exceptions[0]


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
@pytest.mark.parametrize(
    ("body", "url"),
    [
        ("<script>fetch('http://example.invalid/x');</script>", "http://example.invalid/x"),
        ('<img src="http://192.0.2.1/x.png">', "http://192.0.2.1/x.png"),
    ],
    ids=["fetch", "img"],
)
def test_a_request_off_the_machine_is_reported(chromium, tmp_path, body, url):
    result = open_page(_page(tmp_path, body))

    assert result.outside_requests == [url]


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
def test_a_content_security_policy_violation_is_a_console_error(chromium, tmp_path):
    page = _page(
        tmp_path,
        "<script>document.title = 'the script ran';</script>",
        head='<meta http-equiv="Content-Security-Policy" content="default-src \'none\'">',
    )

    result = open_page(page, expressions={"title": "document.title"})

    assert result.values["title"] != "the script ran"
    assert any("Content Security Policy" in error for error in result.console_errors), result.console_errors
    assert result.exceptions == []


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
@pytest.mark.parametrize(
    ("markup", "bold_elements", "shows_tags"),
    [("&lt;b&gt;bold&lt;/b&gt;", 0, True), ("<b>bold</b>", 1, False)],
    ids=["escaped", "raw"],
)
def test_escaped_markup_shows_as_text_and_raw_markup_does_not(chromium, tmp_path, markup, bold_elements, shows_tags):
    page = _page(tmp_path, f"<p>loader {markup}</p>")

    result = open_page(page, expressions={"bold_elements": "document.querySelectorAll('b').length"})

    assert result.values["bold_elements"] == bold_elements
    assert ("loader <b>bold</b>" in result.text) is shows_tags


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
@pytest.mark.parametrize(
    ("color_scheme", "media", "background", "printing"),
    [("light", "screen", "rgb(255, 255, 255)", False), ("dark", "print", "rgb(0, 0, 0)", True)],
)
def test_dark_mode_and_print_are_emulated(chromium, tmp_path, color_scheme, media, background, printing):
    page = _page(
        tmp_path,
        "<p>report</p>",
        head="<style>body { background: rgb(255, 255, 255); }"
        "@media (prefers-color-scheme: dark) { body { background: rgb(0, 0, 0); } }</style>",
    )

    result = open_page(
        page,
        color_scheme=color_scheme,
        media=media,
        expressions={
            "background": "getComputedStyle(document.body).backgroundColor",
            "printing": "matchMedia('print').matches",
        },
    )

    assert result.values == {"background": background, "printing": printing}


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
def test_a_screenshot_holds_the_whole_page_at_the_given_width(chromium, tmp_path):
    page = _page(tmp_path, '<div style="height: 3000px; background: teal">tall</div>')
    png = tmp_path / "page.png"

    open_page(page, screenshot=png, width=640)

    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width == 640
    assert height >= 3000


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
def test_a_page_that_never_loads_times_out_and_leaves_no_process(chromium, tmp_path):
    # The autouse fixture no_leftover_processes_or_threads fails the test if chromium or a helper outlives it.
    page = _page(tmp_path, "<script>for (;;) {}</script>")

    with pytest.raises(TimeoutError, match="chromium did not answer"):
        open_page(page, timeout_s=3)


def test_a_missing_chromium_names_the_package_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(ChromiumMissing, match="apt-get install chromium"):
        find_chromium()
