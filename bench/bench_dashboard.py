"""Dashboard render time in a real browser on 30 days of a 200-replica fleet.

1. Seeds a temporary store with ``fleetscope bench seed`` (or reads ``--store DIR``, a directory
   holding ``ch`` and ``m.db`` that an earlier run seeded, with ``--keep``).
2. Serves it with ``fleetscope dashboard`` and opens every page in headless Chromium (Debian's,
   driven by Playwright) at ``range=30d``:
   - **first render:** a new browser tab on a freshly started server (nothing cached), from
     navigation until the script run is over and every chart is drawn;
   - **rerun:** the same view again (Streamlit's "rerun", key R) within the cache TTL: what a
     second viewer or a widget click costs;
   - **refresh:** a rerun after the cache TTL expired, i.e. what auto-refresh costs: every
     analytics query runs again.
   Budget (issue 8): first render <= 2 s, refresh <= 1 s; each figure is printed with its ratio
   to the budget. The median of ``--repeats`` runs (each page's first render once per server).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dashboard.serve import Served  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run"]
PAGES = ["", "latency", "capacity", "traffic", "cost", "investigate", "fleet"]
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
TTL_S = 10  # dashboard.cache.TTL_S
WATCH = """() => {  // when the script run state changes, by the page's own clock
  const app = document.querySelector('[data-testid=stApp]');
  window.__runs = [];
  new MutationObserver(() => window.__runs.push([app.getAttribute('data-test-script-state'), performance.now()]))
    .observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
}"""


def seed(root: Path, env: dict[str, str], replicas: int, days: float) -> None:
    exe = Path(sys.executable).parent / "fleetscope"
    for args in (["migrate"], ["bench", "seed", "--replicas", str(replicas), "--days", str(days)]):
        subprocess.run([str(exe), *args], cwd=root, env={**os.environ, **env}, check=True)


def drawn(page) -> None:  # noqa: ANN001
    """Until the run is over and every chart on the page has its canvas."""
    page.wait_for_selector(IDLE, timeout=120_000)
    page.wait_for_function("""() => [...document.querySelectorAll('[data-testid=stVegaLiteChart]')]
        .every(c => c.querySelector('canvas, svg'))""", timeout=60_000)


def rerun(page) -> float:  # noqa: ANN001
    """Seconds from asking for a rerun to the end of the run (charts drawn)."""
    page.evaluate(WATCH)
    t0 = page.evaluate("performance.now()")
    page.locator("[data-testid=stMain]").click(position={"x": 5, "y": 5})
    page.keyboard.press("r")
    page.wait_for_function("() => window.__runs.some(r => r[0] === 'running')", timeout=30_000)
    page.wait_for_function("() => window.__runs.length && window.__runs[window.__runs.length - 1][0] === 'notRunning'",
                           timeout=120_000)
    drawn(page)
    return (page.evaluate("window.__runs[window.__runs.length - 1][1]") - t0) / 1000


def measure(url: str, browser, path: str) -> dict:  # noqa: ANN001
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    t0 = time.perf_counter()
    page.goto(f"{url}/{path}?range=30d")
    drawn(page)
    first = time.perf_counter() - t0
    cached = rerun(page)
    page.wait_for_timeout((TTL_S + 1) * 1000)
    refresh = rerun(page)
    errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]').all_inner_texts()
    page.close()
    return {"first_render_s": first, "rerun_cached_s": cached, "refresh_s": refresh, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="servers started, each page measured once per server")
    parser.add_argument("--store", type=Path, help="a directory seeded by an earlier run (kept with --keep)")
    parser.add_argument("--keep", type=Path, help="seed into this directory and keep it")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        root = args.store or args.keep or Path(tmp)
        env = {"FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{root / 'ch'}", "FLEETSCOPE_METADATA_URL": f"sqlite:///{root / 'm.db'}"}
        if args.store is None:
            print(f"seeding {args.days:g} days of {args.replicas} replicas into {root} ...", flush=True)
            t = time.perf_counter()
            seed(root, env, args.replicas, args.days)
            print(f"seeded in {time.perf_counter() - t:.0f}s", flush=True)
        runs: dict[str, list[dict]] = {p or "overview": [] for p in PAGES}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            for i in range(args.repeats):
                with Served(root, env) as served:
                    for path in PAGES:
                        result = measure(served.url, browser, path)
                        runs[path or "overview"].append(result)
                        print(f"  run {i + 1} {path or 'overview':<12} first {result['first_render_s']:.2f}s  "
                              f"rerun {result['rerun_cached_s']:.2f}s  refresh {result['refresh_s']:.2f}s"
                              + (f"  ERRORS {result['errors']}" if result["errors"] else ""), flush=True)
            browser.close()
    print(f"\n7. dashboard render, range=30d over {args.days:g} days x {args.replicas} replicas "
          f"(median of {args.repeats}; headless Chromium)")
    print(f"   {'page':<14} {'first':>7} {'/2 s':>6} | {'refresh':>7} {'/1 s':>6} | {'rerun (cached)':>14}")
    summary = {}
    for page, results in runs.items():
        first = statistics.median(r["first_render_s"] for r in results)
        refresh = statistics.median(r["refresh_s"] for r in results)
        cached = statistics.median(r["rerun_cached_s"] for r in results)
        summary[page] = {"first_render_s": first, "refresh_s": refresh, "rerun_cached_s": cached,
                         "errors": sorted({e for r in results for e in r["errors"]})}
        print(f"   {page:<14} {first:6.2f}s {first / 2:5.2f}x | {refresh:6.2f}s {refresh / 1:5.2f}x | {cached:13.2f}s")
    if args.json:
        args.json.write_text(json.dumps({"replicas": args.replicas, "days": args.days, "repeats": args.repeats,
                                         "budget": {"first_render_s": 2.0, "refresh_s": 1.0}, "pages": summary},
                                        indent=2))


if __name__ == "__main__":
    main()
