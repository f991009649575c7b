"""A report's HTML page shown inside another page (a Jupyter notebook's output): a sandboxed iframe holding the whole
page, so that its styles cannot reach the notebook's, nor the notebook's its own, and its Content-Security-Policy
still holds."""

from __future__ import annotations

from html import escape

# Tall enough for a loader's verdict, findings and first chart without scrolling the frame; the reader drags its
# corner for more (resize), or writes the page to a file (loaderdoctor.show(report, html_path=...)).
FRAME_HEIGHT_PX = 720


def inline_frame(page: str, *, title: str, height_px: int = FRAME_HEIGHT_PX) -> str:
    """`page` (a whole HTML document) as an iframe's `srcdoc`: escaped for the attribute, so that nothing of it is
    read as the host page's markup; sandboxed with no permission at all (no script, no same origin, no form, no
    navigation of the host), so that the page is as inert as it is in a file of its own."""
    return (
        f'<iframe sandbox="" srcdoc="{escape(page, quote=True)}" title="{escape(title, quote=True)}" '
        f'style="width: 100%; height: {int(height_px)}px; border: 1px solid #d8dde6; border-radius: 4px; '
        'resize: vertical; overflow: auto;"></iframe>'
    )
