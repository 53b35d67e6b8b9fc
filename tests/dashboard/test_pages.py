"""Dashboard pages under Streamlit's AppTest: each renders without an exception on an empty store
and on a simulated tenant-shift run, with filters from the URL, and shows what ``analytics``
returns for the same view."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from analytics.cost import cost_per_token
from analytics.metrics import histogram_quantile
from dashboard.context import use_stores
from dashboard.view import read_view, view_params
from fleetscope.settings import load_settings
from migrations import clickhouse_runner, metadata_runner
from storage.catalog import gpu_prices
from storage.metadata import make_engine, make_sessionmaker
from tests.analytics.scenario_data import play

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["overview", "latency", "cost"]


def run(page: str, **params: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / f"{page}.py"), default_timeout=60)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


@pytest.fixture
def sessions(sqlite_url: str):  # noqa: ANN201
    metadata_runner.upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def shift(chdb_dir):  # noqa: ANN001
    return play(chdb_dir, "tenant-shift", seed=1)


def window(run_) -> dict[str, str]:  # noqa: ANN001
    return {"from": run_.start.isoformat(), "to": run_.end.isoformat()}


def test_the_view_round_trips_through_the_query_string() -> None:
    now = datetime(2026, 11, 29, 12, 0, 7, tzinfo=UTC)
    view = read_view({"range": "6h", "refresh": "30", "model": "a,b", "tenant": "acme"}, now=now)
    assert view.end - view.start == timedelta(hours=6) and view.filters.model == ("a", "b")
    assert read_view(view_params(view), now=now) == view
    custom = read_view({"from": "2026-11-29T10:00:00Z", "to": "2026-11-29T11:00:00+00:00"}, now=now)
    assert (custom.range_key, custom.span) == ("custom", timedelta(hours=1))
    bad = read_view({"range": "2y", "refresh": "soon", "from": "yesterday"}, now=now)
    assert bad.range_key == "1h" and bad.refresh_s == 0 and len(bad.problems) == 2


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_on_an_empty_store(page: str, ch, sessions) -> None:  # noqa: ANN001
    clickhouse_runner.apply(ch)
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run(page, range="15m")
    assert not at.exception, at.exception
    assert at.title[0].value.lower() == page
    shown = " ".join(m.value for m in [*at.info, *at.caption])
    assert "No " in shown or "no " in shown  # an empty state that says why, not a blank page


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_a_simulated_run_with_filters(page: str, shift, sessions) -> None:  # noqa: ANN001
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    for params in ({}, {"model": "tiny-large"}, {"tenant": "bigcorp", "route": "model-router:large/least_loaded"}):
        at = run(page, **window(shift), **params)
        assert not at.exception, (params, at.exception)
        assert not at.error, (params, [e.value for e in at.error])


def test_overview_shows_the_analytics_numbers(shift, sessions) -> None:  # noqa: ANN001
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("overview", **window(shift))
    metrics = {m.label: m.value for m in at.metric}
    view = read_view(window(shift))
    p99 = histogram_quantile(shift.client, "vllm:time_to_first_token_seconds", 0.99, view.start, view.end, "fleet")
    assert metrics["p99 TTFT"] == f"{p99['quantile'].iloc[0]:.3f} s"
    assert metrics["Replicas up"] == "3"
    fleet = cost_per_token(shift.client, view.start, view.end, gpu_prices(sessions)).set_index("model").loc["(fleet)"]
    assert metrics["Cost per hour"] == f"${fleet['spend'] / view.span.total_seconds() * 3600:,.2f}"


def test_cost_page_offers_the_showback_as_csv(shift, sessions) -> None:  # noqa: ANN001
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("cost", **window(shift))
    assert not at.exception
    tables = [t.value for t in at.dataframe]
    showback = next(t for t in tables if "tenant" in t.columns)
    assert "bigcorp" in set(showback["tenant"])
    assert any(b.label == "Download CSV" for b in at.get("download_button"))


def test_a_store_that_cannot_be_read_is_one_clear_error(ch, sessions) -> None:  # noqa: ANN001
    use_stores(ch, sessions, None)  # a database never migrated: no tables
    at = run("overview", range="1h")
    assert not at.exception
    assert at.error and "cannot be read" in at.error[0].value
