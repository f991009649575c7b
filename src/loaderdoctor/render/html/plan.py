"""A DDP plan on an HTML page: the console's words for it, without colour, as preformatted text."""

from __future__ import annotations

import io

from rich.console import Console

from loaderdoctor.loader.ddp import DdpPlan
from loaderdoctor.render.html.page import esc
from loaderdoctor.render.plan import plan_view


def plan_block(plan: DdpPlan) -> str:
    """The plan's heading and block, for a loader's section."""
    console = Console(file=io.StringIO(), width=100, color_system=None, force_terminal=False)
    with console.capture() as captured:
        console.print(plan_view(plan))
    return "<h3>DDP plan</h3>" + f"<pre>{esc(captured.get().rstrip())}</pre>"
