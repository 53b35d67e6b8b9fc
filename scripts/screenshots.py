"""Screenshots of a running dashboard's pages, as the README shows them.

In:  the dashboard's URL (e.g. the one `fleetscope up` announces), the pages with their query
     strings, an output folder; Debian's Chromium (``scripts/ensure-chromium.sh``).
Out: one full-page PNG per page, ``NAME.png`` in the folder; a line per page with its render time
     (from the navigation until the page is idle for good: a rerun it asks for counts).

    .venv/bin/python scripts/screenshots.py http://127.0.0.1:8501 --out docs/screenshots \\
        demo-overview=/?range=15m demo-investigate=/investigate?range=15m demo-alerts=/alerts?range=15m
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the dashboard, e.g. http://127.0.0.1:8501")
    parser.add_argument("pages", nargs="+", help="NAME=PATH?QUERY, e.g. overview=/?range=15m")
    parser.add_argument("--out", type=Path, default=Path("tests/artifacts"), help="where the PNGs go")
    parser.add_argument("--width", type=int, default=1440)
    parser.add_argument("--chromium", default=os.environ.get("FLEETSCOPE_CHROMIUM", "/usr/bin/chromium"))
    args = parser.parse_args()
    shots = []
    for item in args.pages:
        name, sep, path = item.partition("=")
        if not sep or not path.startswith("/"):
            parser.error(f"{item!r}: write NAME=/path?query")
        shots.append((name, path))
    if not Path(args.chromium).exists():
        parser.error(f"{args.chromium} missing: run scripts/ensure-chromium.sh")
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": args.width, "height": 1000})
        for name, path in shots:
            t0 = time.monotonic()
            page.goto(args.url.rstrip("/") + path)
            idle = []
            for _ in range(2):  # a rerun asked for at the end of a run starts a moment later
                page.wait_for_selector(IDLE, timeout=120_000)
                idle.append(time.monotonic())
                page.wait_for_timeout(500)
            # the render ends when the page went idle for good: the first time, unless a rerun
            # followed (the second look found it idle only after running again)
            took = (idle[1] if idle[1] - idle[0] > 0.75 else idle[0]) - t0
            height = page.evaluate("document.querySelector('[data-testid=stMain]')?.scrollHeight || 1000")
            page.set_viewport_size({"width": args.width, "height": min(int(height) + 40, 8000)})
            page.wait_for_timeout(800)  # charts re-layout to the new size
            page.screenshot(path=str(args.out / f"{name}.png"))
            page.set_viewport_size({"width": args.width, "height": 1000})
            print(f"{name}: {args.out / f'{name}.png'} ({took:.1f}s)")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
