"""A PNG of an HTML report as headless Chromium draws it, for the README: python tests/browser/screenshot.py
REPORT.html OUT.png [--dark] [--width PX]."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chromium import open_page


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("report", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--dark", action="store_true", help="as a reader in dark mode sees it")
    parser.add_argument("--width", type=int, default=1100)
    args = parser.parse_args(argv)
    page = open_page(args.report, screenshot=args.png, width=args.width, color_scheme="dark" if args.dark else "light")
    problems = page.errors + page.outside_requests
    print(f"{args.png}: {page.svg_count} charts drawn" + (f"; problems: {problems}" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
