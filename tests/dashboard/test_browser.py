"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against
`fleetscope dashboard` serving a simulated tenant-shift incident from its own chDB store.

Each page loads with no error element and no error in the browser's console, and draws a chart; the time-range control changes the
URL; a password-protected dashboard shows nothing before the password. Screenshots of every
page land in tests/artifacts/ (not committed; the README's come from there)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dashboard import pages
from dashboard.serve import Served
from tests.conftest import ROOT, missing, need, run_cli

playwright = need("playwright.sync_api", "the browser tests drive Chromium with Playwright (the test extra)")

CHROMIUM = os.environ.get("FLEETSCOPE_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "tests" / "artifacts"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
# every page of the app (dashboard.pages) that draws a chart as it opens, by url path; the Plan page draws
# none before it is asked (its own test below), and the sidebar lists them all
PAGES = {p.url_path: p.title for p in pages.PAGES if p.draws_on_open}
DEFAULT = pages.PAGES[0].url_path  # served at "/"
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'

if not Path(CHROMIUM).exists():
    missing(f"{CHROMIUM} missing: run scripts/ensure-chromium.sh (make test does)", module_level=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("browser")
    env = {
        "FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{root / 'ch'}",
        "FLEETSCOPE_METADATA_URL": f"sqlite:///{root / 'm.db'}",
        "FLEETSCOPE_FLEET_SPEC": str(ROOT / "fleet.yaml"),
    }
    # the evaluator once on the incident, with p99 TTFT targets tight enough that its latency breaks
    # them (pending at least): alert states and their history for the Alerts page
    for args in (
        ("migrate",),
        ("fleet", "simulate", "--scenario", "tenant-shift"),
        ("slo", "set", "tiny-small", "ttft", "0.2"),
        ("slo", "set", "tiny-large", "ttft", "0.2"),
        ("alerts", "run", "--once"),
    ):
        done = run_cli(*args, cwd=root, env=env, timeout=240)
        assert done.returncode == 0, done.stderr
    return root, env


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def dashboard(store) -> Iterator[Served]:
    d = Served(*store)
    yield d
    d.stop()


def window_shown(caption: str) -> tuple[datetime, datetime]:
    """The window a page's caption names: "2026-11-30 07:20 – 2026-11-30 13:20 UTC ..."."""
    start, end = re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d", caption)[:2]
    return datetime.fromisoformat(start), datetime.fromisoformat(end)


def settle(page) -> None:
    """Wait until the script run is over (the app says so on its root element)."""
    page.wait_for_selector(IDLE, timeout=90_000)
    page.wait_for_timeout(300)  # a rerun asked for at the end of a run starts a moment later
    page.wait_for_selector(IDLE, timeout=90_000)


def shoot(page, path: Path) -> None:
    """The whole page: Streamlit scrolls its main block, not the document, so grow the viewport."""
    height = page.evaluate("document.querySelector('[data-testid=stMain]')?.scrollHeight || 1000")
    page.set_viewport_size({"width": 1440, "height": min(int(height) + 40, 8000)})
    page.wait_for_timeout(500)  # charts re-layout to the new size
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1440, "height": 1000})


@pytest.mark.timeout(600)
def test_every_page_loads_draws_a_chart_and_shows_no_error(dashboard, browser) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    # a chart whose spec Vega cannot draw shows an empty frame and says so only in the console
    # (an axis option once left every time chart blank: "Cannot read properties of undefined"); and a
    # resource the page cannot fetch fails on a closed network (a page's icon came from fonts.gstatic.com).
    # Left aside: the 404s the console reports for Streamlit's own probe of /PAGE/_stcore/health on a
    # page's direct URL, before it finds the server's root
    logged: list[str] = []
    page.on(
        "console",
        lambda m: (
            logged.append(m.text)
            if m.type == "error"
            and not m.text.startswith("Failed to load resource: the server responded with a status of 404")
            else None
        ),
    )
    page.on("pageerror", lambda e: logged.append(str(e)))
    page.on("requestfailed", lambda r: logged.append(f"cannot fetch {r.url}"))
    for path, title in PAGES.items():
        logged.clear()
        page.goto(f"{dashboard.url}/{'' if path == DEFAULT else path}?range=1h")  # the default page is "/"
        settle(page)
        page.get_by_role("heading", name=title).first.wait_for(timeout=30_000)
        charts = page.locator('[data-testid="stVegaLiteChart"]')
        charts.first.wait_for(timeout=30_000)
        page.locator('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg').first.wait_for()
        assert page.locator('[data-testid="stException"]').count() == 0, path
        assert page.locator('[role="dialog"]').count() == 0, (path, page.locator('[role="dialog"]').all_inner_texts())
        errors = page.locator('[data-testid="stAlertContentError"]')
        assert errors.count() == 0, (path, errors.all_inner_texts())
        shoot(page, ARTIFACTS / f"{path}.png")
        assert not logged, (path, logged[:3])
    # the sidebar lists the pages by their titles (the page files are not served on their own)
    nav = page.locator('[data-testid="stSidebarNav"]').inner_text()
    assert all(p.title in nav for p in pages.PAGES) and "app" not in nav.split()
    page.close()


@pytest.mark.timeout(300)
def test_the_plan_page_replays_the_window_when_asked(dashboard, browser) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.goto(f"{dashboard.url}/plan?range=1h")
    settle(page)
    page.get_by_role("heading", name="Plan").first.wait_for(timeout=30_000)
    assert page.locator('[data-testid="stVegaLiteChart"]').count() == 0  # nothing replayed before it is asked
    page.get_by_role("button", name="Replay").click()
    page.locator('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg').first.wait_for(
        timeout=120_000
    )
    settle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    errors = page.locator('[data-testid="stAlertContentError"]')
    assert errors.count() == 0, errors.all_inner_texts()
    text = page.locator('[data-testid="stMain"]').inner_text()
    assert "replayed as it ran" in text and "p99 TTFT by fleet" in text
    shoot(page, ARTIFACTS / "plan.png")
    page.close()


@pytest.mark.timeout(300)
def test_the_time_range_control_changes_the_url(dashboard, browser) -> None:
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.goto(f"{dashboard.url}/?range=1h")
    settle(page)
    before = page.locator("[data-testid='stCaptionContainer']").first.inner_text()
    page.locator('[data-testid="stSidebar"] [aria-label="Time range"]').first.click()
    page.get_by_role("option", name="6h", exact=True).click()
    page.wait_for_url("**range=6h**", timeout=30_000)
    settle(page)
    after = page.locator("[data-testid='stCaptionContainer']").first.inner_text()
    assert before != after  # the window the page says it shows moved with the control
    # another page from the sidebar keeps the view (Streamlit drops the query string on a page switch)
    page.locator('[data-testid="stSidebarNav"]').get_by_text("Latency", exact=True).click()
    page.wait_for_url("**/latency?**range=6h**", timeout=30_000)
    settle(page)
    start, end = window_shown(page.locator("[data-testid='stCaptionContainer']").first.inner_text())
    assert end - start == timedelta(hours=6)  # the same 6 hours (their end may have moved on by a minute)
    assert abs(start - window_shown(after)[0]) <= timedelta(minutes=1)
    page.close()


@pytest.mark.timeout(300)
def test_auto_refresh_reruns_a_page_that_has_nothing_to_show(dashboard, browser) -> None:
    page = browser.new_page()
    page.goto(f"{dashboard.url}/?from=2020-01-01T00:00:00Z&to=2020-01-01T01:00:00Z&refresh=10")
    settle(page)
    assert "No engine metrics" in page.locator('[data-testid="stAlertContentInfo"]').first.inner_text()
    page.evaluate("""() => { window.__runs = 0; const app = document.querySelector('[data-testid=stApp]');
        new MutationObserver(() => { if (app.getAttribute('data-test-script-state') === 'running') window.__runs++; })
          .observe(app, {attributes: true}); }""")
    page.wait_for_function("() => window.__runs >= 1", timeout=25_000)  # one refresh within 10 s (+ slack)
    settle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()


@pytest.mark.timeout(300)
def test_a_password_protects_every_page(tmp_path: Path, browser) -> None:
    # a store of its own: the module's dashboard holds the simulated one (chDB: one process per directory)
    env = {
        "FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{tmp_path / 'ch'}",
        "FLEETSCOPE_METADATA_URL": f"sqlite:///{tmp_path / 'm.db'}",
    }
    assert run_cli("migrate", cwd=tmp_path, env=env).returncode == 0
    d = Served(tmp_path, {**env, "FLEETSCOPE_DASHBOARD_PASSWORD": "correct horse"})
    try:
        page = browser.new_page()
        page.goto(f"{d.url}/cost?range=1h")
        settle(page)
        assert page.get_by_role("heading", name="Cost").count() == 0
        field = page.get_by_label("Password", exact=True)
        field.fill("wrong password")
        page.get_by_role("button", name="Log in").click()
        page.locator('[data-testid="stAlertContentError"]').wait_for(timeout=30_000)
        assert page.get_by_role("heading", name="Cost").count() == 0
        field.fill("correct horse")
        page.get_by_role("button", name="Log in").click()
        page.get_by_role("heading", name="Cost").first.wait_for(timeout=60_000)
        page.close()
    finally:
        d.stop()


@pytest.fixture(scope="module")
def cost_spike(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A dashboard on the router-shift scenario: a tenant's requests move pool, the others pay."""
    root = tmp_path_factory.mktemp("cost")
    env = {
        "FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{root / 'ch'}",
        "FLEETSCOPE_METADATA_URL": f"sqlite:///{root / 'm.db'}",
        "FLEETSCOPE_FLEET_SPEC": str(ROOT / "fleet.yaml"),
    }
    for args in (("migrate",), ("fleet", "simulate", "--scenario", "router-shift")):
        done = run_cli(*args, cwd=root, env=env, timeout=240)
        assert done.returncode == 0, done.stderr
    d = Served(root, env)
    yield d
    d.stop()


@pytest.mark.timeout(300)
def test_the_cost_spike_is_explained_and_charted_in_the_browser(cost_spike, browser) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.goto(f"{cost_spike.url}/investigate?metric=cost&tenant=globex&range=1h")
    settle(page)
    sentence = page.locator('[data-testid="stAlertContentSuccess"]').first
    sentence.wait_for(timeout=30_000)
    assert "Cost per 1M tokens of tenant globex rose" in sentence.inner_text()
    assert "tiny-small" in sentence.inner_text() and "acme" in sentence.inner_text()
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 3  # the series, the waterfall, the flows
    assert page.locator('[data-testid="stException"]').count() == 0
    shoot(page, ARTIFACTS / "cost-investigate.png")
    page.goto(f"{cost_spike.url}/cost?range=1h")
    settle(page)
    page.get_by_text("tenant", exact=True).first.click()  # the series by tenant: globex's and initech's rise
    settle(page)
    links = page.get_by_role("link", name="explain it")
    links.first.wait_for(timeout=30_000)
    assert "metric=cost" in (links.first.get_attribute("href") or "")
    assert page.locator('[data-testid="stException"]').count() == 0
    shoot(page, ARTIFACTS / "cost-series.png")
    page.close()


@pytest.fixture(scope="module")
def spec_lora(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    """A dashboard on fleet-spec-lora.yaml's two incidents, one after the other in one store: the
    spec-decode replica's acceptance collapse, then the adapters' thrash."""
    root = tmp_path_factory.mktemp("spec-lora")
    env = {
        "FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{root / 'ch'}",
        "FLEETSCOPE_METADATA_URL": f"sqlite:///{root / 'm.db'}",
        "FLEETSCOPE_FLEET_SPEC": str(ROOT / "fleet-spec-lora.yaml"),
    }
    began = datetime.now(UTC).replace(microsecond=0)
    for args in (
        ("migrate",),
        ("fleet", "simulate", "--scenario", "acceptance-collapse", "--ago", "32"),
        ("fleet", "simulate", "--scenario", "adapter-thrash"),
    ):
        done = run_cli(*args, cwd=root, env=env, timeout=240)
        assert done.returncode == 0, done.stderr
    d = Served(root, env)
    # the collapse's own window: the second simulation restarted every engine's counters from zero
    # in a separate replay, which no collector saw restart
    yield d, f"from={(began - timedelta(minutes=32)).isoformat()}&to={(began - timedelta(minutes=17)).isoformat()}"
    d.stop()


@pytest.mark.timeout(300)
def test_speculative_decoding_and_adapters_are_drawn_in_the_browser(spec_lora, browser) -> None:
    served, collapse = spec_lora
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    for path, section, view in (
        ("latency", "Speculative decoding", collapse),
        ("capacity", "LoRA adapters", "range=1h"),
        ("cost", "Spend per LoRA adapter", "range=1h"),
    ):
        page.goto(f"{served.url}/{path}?{view.replace('+', '%2B')}")
        settle(page)
        heading = page.get_by_role("heading", name=section).first
        heading.wait_for(timeout=30_000)
        assert page.locator('[data-testid="stException"]').count() == 0, path
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0, path
        # its table is a canvas grid (its cells are not in the page's text): it is drawn, and the screenshot
        # in tests/artifacts shows it; AppTest checks its cells (tests/dashboard/test_pages_specdecode_lora.py)
        page.locator('[data-testid="stDataFrame"] canvas').first.wait_for(timeout=30_000)
        if path == "latency":  # the window's totals, not dashes: its drafts were counted
            assert page.get_by_test_id("stMetricValue").first.inner_text().endswith("%"), path
        shoot(page, ARTIFACTS / f"{path}-spec-lora.png")
    assert not errors, errors[:3]
    page.close()
