"""Dashboard render time in a real browser on 30 days of a 200-replica fleet.

1. Seeds a temporary store with ``fleetscope bench seed`` (or reads ``--store DIR``, a directory
   holding ``ch`` (and ``m.db``, migrated here when missing) that an earlier run seeded, with
   ``--keep``, or ``bench_warehouse.py --keep``: ``make bench`` seeds once for both).
2. Serves it with ``fleetscope dashboard`` and opens every page in headless Chromium (Debian's,
   driven by Playwright) at ``range=30d``:
   - **first render:** a new browser tab on a freshly started server (nothing cached), from
     navigation until the script run is over and every chart is drawn (by the page's clock:
     navigation start to the later of the run's end and the last chart's first canvas; a chart
     whose code arrives after the run's end is waited for);
   - **second viewer:** another tab on the same view right after (the analytics answers cached);
   - **refresh:** the runs the page's own auto-refresh (every 10 s) starts, from start to end with
     the charts drawn. The served dashboard's 30-day window moves every 20 s
     (``dashboard.max_grain_s``; 10 minutes by default), so of two refreshes one reads the answers
     cached for its window (*within the grain*) and one runs every query again (*across it*), as
     the one refresh in 60 that crosses into the next 10 minutes does by default.
3. Streamlit's floor, measured in the same run: a new tab on a bare app with a title and one
   chart, served and timed the same way; beside it, for reference, the same page inside the
   dashboard's sidebar (navigation to nine pages, two selectboxes, the Filters box).
   Budgets (issue 27): first render less the floor <= 0.5 s, a refresh within the grain <= 0.3 s,
   across it <= 1 s; each printed with ok / OVER. The median of ``--repeats`` runs (each page's
   first render once per server).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dashboard.pages import PAGES as APP_PAGES  # noqa: E402
from dashboard.serve import Served, free_port, wait_healthy  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
# the app's pages (dashboard.pages) that draw their charts as they open, by url path ("" for the default
# page, served at "/"); the Plan page draws nothing until its form is sent
PAGES = ["" if i == 0 else p.url_path for i, p in enumerate(APP_PAGES) if p.draws_on_open]
DEFAULT = APP_PAGES[0].url_path  # the name of the page served at "/"
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
REFRESH_S = 10  # the shortest auto-refresh
# dashboard.max_grain_s of the served dashboard: its 30-day view moves every 20 s instead of 10 minutes,
# so that a bench run sees refreshes that cross into the next grain (every query runs again) beside
# those within it (every answer read from the cache), measured the same way
GRAIN_S = 20
REFRESHES = 2  # per page and server: one of two crosses
AMBIGUOUS_S = 0.3
BUDGET = {"over_floor_s": 0.5, "refresh_within_s": 0.3, "refresh_crossing_s": 1.0}  # issue 27
WATCH = """() => {  // when the script run state changes, by the page's own clock
  const app = document.querySelector('[data-testid=stApp]');
  window.__runs = [];
  new MutationObserver(() => window.__runs.push([app.getAttribute('data-test-script-state'), performance.now()]))
    .observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
}"""


def migrate(root: Path, env: dict[str, str]) -> None:
    """The metadata DB of a store seeded elsewhere (``bench_warehouse.py --keep``)."""
    exe = Path(sys.executable).parent / "fleetscope"
    subprocess.run([str(exe), "migrate"], cwd=root, env={**os.environ, **env}, check=True)


def seed(root: Path, env: dict[str, str], replicas: int, days: float) -> None:
    exe = Path(sys.executable).parent / "fleetscope"
    for args in (["migrate"], ["bench", "seed", "--replicas", str(replicas), "--days", str(days)]):
        subprocess.run([str(exe), *args], cwd=root, env={**os.environ, **env}, check=True)


DRAWS = """() => {  // per chart, when it first had its canvas; when the script run last went idle (page clock)
  window.__drawn = []; window.__idle = 0; window.__running = 0;
  const seen = new WeakSet();
  new MutationObserver(() => {
    const app = document.querySelector('[data-testid=stApp]');
    if (app && app.getAttribute('data-test-script-state') === 'notRunning') window.__idle = window.__idle || performance.now();
    else if (app) { window.__idle = 0;
      if (app.getAttribute('data-test-script-state') === 'running') window.__running = window.__running || performance.now(); }
    for (const c of document.querySelectorAll('[data-testid=stVegaLiteChart]')) {
      if (!seen.has(c) && c.querySelector('canvas, svg')) { seen.add(c); window.__drawn.push(performance.now()); }
    }
  }).observe(document, {subtree: true, childList: true, attributes: true});
}"""
SETTLE_MS = 400  # a chart whose code loads late shows up after the run is over: look again after this


def drawn(page) -> None:
    """Until the run is over and every chart on the page has its canvas, and still so a moment later."""
    for _ in range(2):
        page.wait_for_selector(IDLE, timeout=120_000)
        page.wait_for_function(
            """() => [...document.querySelectorAll('[data-testid=stVegaLiteChart]')]
            .every(c => c.querySelector('canvas, svg'))""",
            timeout=60_000,
        )
        page.wait_for_timeout(SETTLE_MS)


def next_run(page) -> tuple[float, float]:
    """(seconds the next script run takes, charts drawn; when it began, in seconds since the epoch):
    the page's auto-refresh starts it."""
    page.evaluate(WATCH)
    page.wait_for_function("() => window.__runs.some(r => r[0] === 'running')", timeout=60_000)
    page.wait_for_function("() => window.__runs[window.__runs.length - 1][0] === 'notRunning'", timeout=120_000)
    drawn(page)
    runs = page.evaluate("window.__runs")
    began = next(t for state, t in runs if state == "running")
    return (runs[-1][1] - began) / 1000, (page.evaluate("performance.timeOrigin") + began) / 1000


def grain_start(margin_s: float = 0.5, needed_s: float = 8.0) -> None:
    """Until the first render and the second viewer fit in one window: now, if the grain has
    ``needed_s`` left, or else ``margin_s`` after the next multiple of ``GRAIN_S``."""
    phase = time.time() % GRAIN_S
    if not margin_s <= phase <= GRAIN_S - needed_s:
        time.sleep((margin_s - phase) % GRAIN_S)


def refreshes(page, first_run_at: float, count: int) -> tuple[list[float], list[float]]:
    """(refreshes within the grain, refreshes that crossed into the next one), seconds each: of two
    refreshes ``REFRESH_S`` apart with a grain of ``GRAIN_S``, one crosses. A refresh that began
    within ``AMBIGUOUS_S`` of a boundary is left out (the server's clock floors it, not ours)."""
    within, crossing = [], []
    before = first_run_at
    for _ in range(count):
        took, at = next_run(page)
        phase = at % GRAIN_S
        if AMBIGUOUS_S < phase < GRAIN_S - AMBIGUOUS_S:
            (crossing if at // GRAIN_S != before // GRAIN_S else within).append(took)
        before = at
    return within, crossing


class Render(NamedTuple):
    """One page load by the page's clock, in seconds from navigation."""

    total: float  # the later of the run's end and the last chart drawn
    run_start: float  # the script run began (before it: Streamlit's page and websocket set-up)
    run_end: float  # the run was over (the server's work and the browser's handling of what it sent)

    @property
    def parts(self) -> dict[str, float]:
        return {
            "before_run_s": self.run_start,
            "run_s": self.run_end - self.run_start,
            "drawn_after_run_s": max(0.0, self.total - self.run_end),
        }


def open_page(browser, url: str) -> tuple[object, Render]:
    """A new tab: in a fresh browser context (nothing cached), or, given a context, in that one
    (``--warm-browser``: the browser has Streamlit's scripts cached, as for a user who opened the
    dashboard before). Seconds from navigation to the later of the run's end and the last chart
    drawn, by the page's own clock (the settling look in ``drawn`` is not counted)."""
    fresh = hasattr(browser, "new_context")  # a Browser: each page in a context of its own
    page = browser.new_page(viewport={"width": 1440, "height": 1000}) if fresh else browser.new_page()
    page.add_init_script(f"({DRAWS})()")
    page.goto(url)
    drawn(page)
    idle, last, running = page.evaluate("[window.__idle, Math.max(0, ...window.__drawn), window.__running]")
    return page, Render(max(idle, last) / 1000, (running or idle) / 1000, idle / 1000)


def measure(url: str, browser, path: str, refresh: bool = True) -> dict:
    """A page's first render, a second viewer's, and (``refresh``) its auto-refreshes."""
    grain_start()
    watched, first = open_page(browser, f"{url}/{path}?range=30d&refresh={REFRESH_S}")
    first_run_at = (watched.evaluate("performance.timeOrigin") / 1000) + first.run_start
    second, warm = open_page(browser, f"{url}/{path}?range=30d")  # another viewer, same view, same grain
    second.close()
    within, crossing = refreshes(watched, first_run_at, REFRESHES) if refresh else ([], [])
    errors = watched.locator('[data-testid="stException"]').all_inner_texts()
    watched.close()
    return {
        "first_render_s": first.total,
        **first.parts,
        "second_viewer_s": warm.total,
        "refresh_within_s": within,
        "refresh_crossing_s": crossing,
        "errors": errors,
    }


FLOOR_APP = """import altair as alt, pandas as pd, streamlit as st
st.set_page_config(layout="wide")
st.title("floor")
df = pd.DataFrame({"ts": pd.date_range("2026-01-01", periods=120, freq="6h", tz="UTC"), "value": range(120)})
st.altair_chart(alt.Chart(df).mark_line().encode(x="ts:T", y="value:Q"), width="stretch")
"""
# the same page inside what every dashboard page has around it (a reference, not the budget's floor):
# the sidebar's navigation to nine pages, its two selectboxes and its Filters box
CHROME_APP = """import streamlit as st
from pathlib import Path
st.set_page_config(layout="wide")
here = Path(__file__).parent
pages = [st.Page(str(here / "floor_page.py"), title=f"Page {i}", url_path=f"p{i}", default=i == 0) for i in range(9)]
page = st.navigation(pages)
st.sidebar.selectbox("Time range", ["15m", "1h", "6h", "24h", "7d", "30d"], index=5)
st.sidebar.selectbox("Auto-refresh", [0, 10, 30], format_func=lambda s: "off" if s == 0 else f"every {s}s")
with st.sidebar.popover("Filters", width="stretch"):
    for name in ("Model", "Replica", "Tenant", "Route"):
        st.multiselect(name, ["a", "b"])
page.run()
"""


def _streamlit(app: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(app),
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def floors(browser, root: Path, repeats: int) -> dict[str, tuple[float, dict[str, float]]]:
    """Streamlit's own floor on this machine: a page with a title and one small chart, nothing
    read (``bare``); and the same page in the dashboard's sidebar (``chrome``). Each its median
    render and parts, the two measured in turn."""
    (root / "floor_app.py").write_text(FLOOR_APP)
    (root / "floor_page.py").write_text(FLOOR_APP.replace('st.set_page_config(layout="wide")\n', ""))
    (root / "floor_chrome.py").write_text(CHROME_APP)
    servers = {name: _streamlit(root / app) for name, app in (("bare", "floor_app.py"), ("chrome", "floor_chrome.py"))}
    try:
        renders: dict[str, list[Render]] = {name: [] for name in servers}
        for proc, url in servers.values():
            wait_healthy(url, proc, 60)
            page, _ = open_page(browser, f"{url}/")  # the first also starts the server's script machinery
            page.close()
        for _ in range(repeats):
            for name, (_proc, url) in servers.items():
                page, render = open_page(browser, f"{url}/")
                page.close()
                renders[name].append(render)
        return {
            name: (
                statistics.median(r.total for r in found),
                {key: statistics.median(r.parts[key] for r in found) for key in found[0].parts},
            )
            for name, found in renders.items()
        }
    finally:
        for proc, _url in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _mark(value: float, budget: float) -> str:
    return "  -" if math.isnan(value) else (" ok" if value <= budget else " OVER")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="servers started, each page measured once per server")
    parser.add_argument("--store", type=Path, help="a directory seeded by an earlier run (kept with --keep)")
    parser.add_argument("--keep", type=Path, help="seed into this directory and keep it")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pages", nargs="+", choices=[p or DEFAULT for p in PAGES], help="only these pages")
    parser.add_argument(
        "--readers",
        type=int,
        help="dashboard.readers for the served dashboard (default: its own, the cores less one)",
    )
    parser.add_argument(
        "--warm-browser",
        action="store_true",
        help="open every tab in one browser context (its cache warm), not a fresh one each",
    )
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        root = (args.store or args.keep or Path(tmp)).resolve()  # the server and fleetscope run with it as cwd
        env = {
            "FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{root / 'ch'}",
            "FLEETSCOPE_METADATA_URL": f"sqlite:///{root / 'm.db'}",
            "FLEETSCOPE_DASHBOARD_MAX_GRAIN_S": str(GRAIN_S),
        }
        if args.readers is not None:
            env["FLEETSCOPE_DASHBOARD_READERS"] = str(args.readers)
        if args.store is not None and not (root / "m.db").exists():  # a store seeded by bench_warehouse.py --keep
            migrate(root, env)
        if args.store is None:
            root.mkdir(parents=True, exist_ok=True)
            print(f"seeding {args.days:g} days of {args.replicas} replicas into {root} ...", flush=True)
            t = time.perf_counter()
            seed(root, env, args.replicas, args.days)
            print(f"seeded in {time.perf_counter() - t:.0f}s", flush=True)
        pages = [p for p in PAGES if args.pages is None or (p or DEFAULT) in args.pages]
        runs: dict[str, list[dict]] = {p or DEFAULT: [] for p in pages}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            if args.warm_browser:  # one context: pages share its HTTP cache (a browser.new_page() has its own)
                browser = browser.new_context(viewport={"width": 1440, "height": 1000})
            measured = floors(browser, root, args.repeats)
            (floor_s, floor_parts), (chrome_s, _chrome_parts) = measured["bare"], measured["chrome"]
            print(
                f"  Streamlit's floor on this machine (a new tab, a title and one chart): {floor_s:.2f}s; "
                f"with the dashboard's sidebar around it: {chrome_s:.2f}s",
                flush=True,
            )
            for i in range(args.repeats):
                with Served(root, env) as served:
                    # a running server: the process has opened the store once (a short window, nothing cached for 30 d)
                    warm, _ = open_page(browser, f"{served.url}/fleet?range=15m")
                    warm.close()
                    for path in pages:
                        # the refreshes wait for the page's own 10 s timer: measured on the first server only
                        result = measure(served.url, browser, path, refresh=i == 0)
                        runs[path or DEFAULT].append(result)
                        print(
                            f"  run {i + 1} {path or 'overview':<12} first {result['first_render_s']:.2f}s  "
                            f"second viewer {result['second_viewer_s']:.2f}s  refresh within the grain "
                            f"{', '.join(f'{x:.2f}s' for x in result['refresh_within_s']) or '-'}, across it "
                            f"{', '.join(f'{x:.2f}s' for x in result['refresh_crossing_s']) or '-'}"
                            + (f"  ERRORS {result['errors']}" if result["errors"] else ""),
                            flush=True,
                        )
            browser.close()
    print(
        f"\n7. dashboard render{' (browser cache warm)' if args.warm_browser else ''}, range=30d over {args.days:g} days "
        f"x {args.replicas} replicas (median of {args.repeats}; headless Chromium, on the same machine as the server)"
    )
    print(f"   Streamlit's floor (a new tab: a title and one chart, nothing read): {floor_s:.2f}s")
    print(f"   the same page in the dashboard's sidebar (navigation, two selectboxes, Filters): {chrome_s:.2f}s")
    print("   first render in parts: before the script run (Streamlit's page and websocket set-up), the run (the")
    print("   server's work, and the browser's handling of what it sends), the charts drawn after the run's end")
    print(
        f"   budgets (issue 27): first - floor <= {BUDGET['over_floor_s']} s; refresh within the grain <= "
        f"{BUDGET['refresh_within_s']} s, across it <= {BUDGET['refresh_crossing_s']} s (grain {GRAIN_S} s here)"
    )
    print(
        f"   {'page':<14} {'first':>7} {'-floor':>12} {'-sidebar':>9} {'before':>7} {'run':>6} {'after':>6} | "
        f"{'2nd viewer':>10} | {'refresh within':>15} | {'across the grain':>16}"
    )
    print(
        f"   {'(floor)':<14} {floor_s:6.2f}s {'':>12} {'':>9} {floor_parts['before_run_s']:6.2f}s "
        f"{floor_parts['run_s']:5.2f}s {floor_parts['drawn_after_run_s']:5.2f}s |"
    )
    summary = {}
    for page, results in runs.items():
        first = statistics.median(r["first_render_s"] for r in results)
        within = _median([x for r in results for x in r["refresh_within_s"]])
        crossing = _median([x for r in results for x in r["refresh_crossing_s"]])
        cached = statistics.median(r["second_viewer_s"] for r in results)
        parts = {key: statistics.median(r[key] for r in results) for key in floor_parts}
        summary[page] = {
            "first_render_s": first,
            "over_floor_s": first - floor_s,
            "over_sidebar_floor_s": first - chrome_s,
            **parts,
            "second_viewer_s": cached,
            "refresh_within_s": within,
            "refresh_crossing_s": crossing,
            "runs": results,
            "errors": sorted({e for r in results for e in r["errors"]}),
        }
        print(
            f"   {page:<14} {first:6.2f}s {first - floor_s:6.2f}s{_mark(first - floor_s, BUDGET['over_floor_s']):<5} "
            f"{first - chrome_s:8.2f}s {parts['before_run_s']:6.2f}s {parts['run_s']:5.2f}s "
            f"{parts['drawn_after_run_s']:5.2f}s | {cached:9.2f}s | "
            f"{within:9.2f}s{_mark(within, BUDGET['refresh_within_s']):<5} | "
            f"{crossing:10.2f}s{_mark(crossing, BUDGET['refresh_crossing_s']):<5}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "replicas": args.replicas,
                    "days": args.days,
                    "repeats": args.repeats,
                    "warm_browser": args.warm_browser,
                    "grain_s": GRAIN_S,
                    "streamlit_floor_s": floor_s,
                    "streamlit_floor_parts": floor_parts,
                    "sidebar_floor_s": chrome_s,
                    "budget": BUDGET,
                    "pages": summary,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
