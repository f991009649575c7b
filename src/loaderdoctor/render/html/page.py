"""The HTML document every report is a page of: one self-contained file (inline CSS, inline SVG, no script, a
Content-Security-Policy that lets nothing load), readable in light and dark mode and in print; and the small
builders the sections share. Every user string goes through esc()."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from html import escape

from loaderdoctor._version import __version__

# Nothing may load or run: no script, no request; styles and images only from the page itself.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

STYLE = """
:root { --fg: #1d2330; --muted: #5b6475; --bg: #ffffff; --panel: #f5f7fa; --line: #d8dde6; --grid: #e7eaf0;
  --step: #3b6fd8; --wait: #f0a23b; --fix: #2e9d5b; --bad: #d33c3c; --warn: #c98a00; --info: #2a8fb0;
  --mark: #8a94a6; --series-0: #3b6fd8; --series-1: #2e9d5b; --series-2: #c2569b; --series-3: #c98a00;
  --series-4: #6a5acd; --series-5: #1f9e9e; color-scheme: light dark; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e4e8ef; --muted: #9aa4b5; --bg: #14171c; --panel: #1d2128; --line: #363c47; --grid: #2a2f38;
    --step: #6f9bf0; --wait: #f4b55c; --fix: #4cc47e; --bad: #f06a6a; --warn: #e6b53c; --info: #4fb5d6;
    --mark: #8d97aa; --series-0: #6f9bf0; --series-1: #4cc47e; --series-2: #e07dbb; --series-3: #e6b53c;
    --series-4: #9d8ff0; --series-5: #45c4c4; }
}
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1040px; padding: 24px 20px 48px; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 32px 0 8px; border-bottom: 1px solid var(--line);
  padding-bottom: 4px; } h3 { font-size: 15px; margin: 20px 0 6px; }
.sub, .muted { color: var(--muted); } .small { font-size: 13px; }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 13px; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px;
  overflow-x: auto; white-space: pre-wrap; }
.verdict { border-left: 5px solid var(--mark); background: var(--panel); padding: 10px 14px; border-radius: 4px;
  margin: 10px 0; } .verdict.critical { border-color: var(--bad); } .verdict.warning { border-color: var(--warn); }
.verdict.info { border-color: var(--info); } .verdict.good { border-color: var(--fix); }
.verdict .head { font-weight: 600; } .tag { display: inline-block; font-size: 12px; font-weight: 600;
  padding: 0 6px; border-radius: 3px; margin-right: 6px; color: #fff; background: var(--mark); }
.tag.critical { background: var(--bad); } .tag.warning { background: var(--warn); }
.tag.info { background: var(--info); } .tag.good { background: var(--fix); }
table.facts, table.data { border-collapse: collapse; margin: 6px 0; }
table.facts th { text-align: right; color: var(--muted); font-weight: normal; padding: 2px 12px 2px 0;
  vertical-align: top; white-space: nowrap; } table.facts td { padding: 2px 0; }
table.data th, table.data td { border-bottom: 1px solid var(--line); padding: 3px 10px; text-align: left; }
table.data td.num, table.data th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.data tr.chosen td { font-weight: 600; color: var(--fix); }
.evidence { font-size: 13px; color: var(--muted); }
svg.chart { width: 100%; height: auto; display: block; margin: 4px 0 12px; }
svg.chart text { fill: var(--muted); font-size: 12px; font-family: inherit; }
svg.chart .grid { stroke: var(--grid); } svg.chart .axis { stroke: var(--line); }
svg.chart .axis-label { fill: var(--fg); }
.step { fill: var(--step); } .wait { fill: var(--wait); } .fix { fill: var(--fix); } .bad { fill: var(--bad); }
.mark line { stroke: var(--mark); stroke-dasharray: 3 3; } .mark text { fill: var(--mark); font-size: 11px; }
.stall line, .died line, .restart line { stroke: var(--bad); stroke-width: 2; }
.stall text, .died text, .restart text { fill: var(--bad); font-size: 11px; font-weight: 600; }
.line { fill: none; stroke-width: 2; }
.s0 { fill: var(--series-0); stroke: var(--series-0); } .s1 { fill: var(--series-1); stroke: var(--series-1); }
.s2 { fill: var(--series-2); stroke: var(--series-2); } .s3 { fill: var(--series-3); stroke: var(--series-3); }
.s4 { fill: var(--series-4); stroke: var(--series-4); } .s5 { fill: var(--series-5); stroke: var(--series-5); }
.line.s0, .line.s1, .line.s2, .line.s3, .line.s4, .line.s5, .line.ideal { fill: none; }
.ideal { stroke: var(--mark); fill: var(--mark); stroke-dasharray: 5 4; }
.highlight circle { fill: none; stroke: var(--fix); stroke-width: 2.5; } .highlight text { fill: var(--fix);
  font-weight: 600; }
.legend-row { font-size: 13px; color: var(--muted); } .legend-row .key { margin-right: 16px; white-space: nowrap; }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: -1px; border-radius: 2px; }
.swatch.step { background: var(--step); } .swatch.wait { background: var(--wait); }
.swatch.ideal { background: var(--mark); }
.swatch.s0 { background: var(--series-0); } .swatch.s1 { background: var(--series-1); }
.swatch.s2 { background: var(--series-2); } .swatch.s3 { background: var(--series-3); }
.swatch.s4 { background: var(--series-4); } .swatch.s5 { background: var(--series-5); }
@media print { .swatch { print-color-adjust: exact; -webkit-print-color-adjust: exact; } }
footer { margin-top: 40px; font-size: 12px; color: var(--muted); border-top: 1px solid var(--line); padding-top: 8px; }
@media print {
  :root { --fg: #000; --muted: #444; --bg: #fff; --panel: #f4f4f4; --line: #bbb; --grid: #e2e2e2; }
  body { max-width: none; padding: 0; font-size: 11pt; } h2 { break-after: avoid; }
  section.loader, svg.chart, .verdict, table { break-inside: avoid; }
  pre { white-space: pre-wrap; }
}
"""


def esc(value: object) -> str:
    """A value as HTML text: markup in names, paths and messages shows as the characters it is."""
    return escape(str(value), quote=True)


def document(title: str, heading: str, subtitle: str, sections: Iterable[str]) -> str:
    """The whole page: the title, a line under it, the sections, and a footer with the version and the time."""
    made = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = "\n".join(sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n"
        f"<body><header><h1>{esc(heading)}</h1><div class='sub'>{esc(subtitle)}</div></header>\n"
        f"{body}\n"
        f"<footer>loaderdoctor {esc(__version__)} · made {made} · one file, nothing loaded from the network</footer>"
        "</body></html>\n"
    )


def facts_table(rows: Sequence[tuple[str, str]]) -> str:
    """A compact two-column table (name, value), both escaped."""
    cells = "".join(f"<tr><th>{esc(name)}</th><td>{esc(value)}</td></tr>" for name, value in rows)
    return f'<table class="facts">{cells}</table>'


def data_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = (), marked: Sequence[int] = ()
) -> str:
    """A table of figures: `numeric` columns right-aligned, `marked` rows (indices) in the chosen style."""
    head = "".join(f'<th class="{"num" if i in numeric else ""}">{esc(h)}</th>' for i, h in enumerate(header))
    lines = []
    for number, row in enumerate(rows):
        cells = "".join(f'<td class="{"num" if i in numeric else ""}">{esc(c)}</td>' for i, c in enumerate(row))
        lines.append(f'<tr class="{"chosen" if number in marked else ""}">{cells}</tr>')
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(lines)}</tbody></table>'


def verdict_box(kind: str, tag: str, head: str, lines: Sequence[str] = (), raw_after: str = "") -> str:
    """A boxed verdict: `kind` is critical, warning, info or good; the tag, head and lines are escaped;
    raw_after is HTML built by the caller (a code block)."""
    body = "".join(f"<div>{esc(line)}</div>" for line in lines if line)
    return (
        f'<div class="verdict {esc(kind)}"><div class="head"><span class="tag {esc(kind)}">{esc(tag)}</span>'
        f"{esc(head)}</div>{body}{raw_after}</div>"
    )


def code(snippet: str) -> str:
    return f"<pre><code>{esc(snippet)}</code></pre>"


def section(title: str, parts: Iterable[str], css: str = "") -> str:
    return f'<section class="{esc(css)}"><h2>{esc(title)}</h2>{"".join(parts)}</section>'
