"""What a reader reads on every page, under Streamlit's AppTest: on an empty store, why it shows
nothing (and no figure made from nothing); on a simulated tenant-shift run, with no filter, a model,
and a tenant and route, the view the page names and its headline figures, each equal to what
``analytics`` computes for the same view."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from adhoc.runner import ReadOnlyRunner
from analytics.cost import cost_by_tenant, cost_per_token, gpu_hours, gpu_spend
from analytics.explain import explain
from analytics.filters import Filters
from analytics.latency import LEVELS, latency_over_time
from analytics.requests import request_totals
from analytics.saturation import saturation, scale_out
from dashboard.context import use_stores
from dashboard.view import read_view
from migrations import clickhouse_runner
from planner.plan import recorded_fleet
from storage.catalog import gpu_prices
from tests.analytics.scenario_data import play
from tests.conftest import migrated_sessions
from tests.dashboard.apptest import PAGES, TITLES, chart_frames, on_store, run, window


@pytest.fixture
def sessions(sqlite_url: str):
    yield from migrated_sessions(sqlite_url)


@pytest.fixture(scope="module")
def shift(chdb_dir):
    return play(chdb_dir, "tenant-shift", seed=1)


# what each page says on a store with nothing in it: why it shows nothing, and what to do
EMPTY = {
    "overview": "No engine metrics between",
    "latency": "No TTFT observations between",
    "capacity": "No KV-cache samples between",
    "traffic": "No request-log rows between",
    "cost": "No replica reported between",
    "investigate": "nothing to investigate",
    "plan": "nothing to replay",
    "alerts": "the evaluator has not run yet",
    "sql": "No rows: the SELECT ran",
    "fleet": "No scrape between",
}


@pytest.mark.parametrize("page", PAGES)
def test_every_page_says_why_an_empty_store_shows_nothing(page: str, ch, sessions, chdb_dir) -> None:
    clickhouse_runner.apply(ch)
    use_stores(ch, sessions, on_store(chdb_dir))
    at = run(page, range="15m")
    assert not at.exception, at.exception
    assert at.title[0].value == TITLES[page]
    said = [m.value for m in at.info]
    # an empty state that says why, not a blank page (a page not in EMPTY yet: that it says something)
    assert any(EMPTY.get(page, "") in m for m in said), said
    # and no number made up from nothing: a figure is a count the store holds (0), or "–"
    assert all(m.value in ("0", "–") for m in at.metric), [(m.label, m.value) for m in at.metric]


FILTERS = [{}, {"model": "tiny-large"}, {"tenant": "bigcorp", "route": "model-router:large/least_loaded"}]


def _filters(params: dict[str, str]) -> Filters | None:
    return Filters(**params) if params else None


def _frames_with(at: AppTest, *columns: str) -> list[pd.DataFrame]:
    return [f for f in chart_frames(at) if set(columns) <= set(f.columns)]


def _check_overview(at, run_, view, sessions, params, store) -> None:
    metrics = {m.label: m.value for m in at.metric}
    filters = _filters(params)
    replicas = saturation(run_.client, view.start, view.end, "replica", filters=filters)
    assert metrics["Replicas reporting"] == str(len(replicas))
    fleet = cost_per_token(run_.client, view.start, view.end, gpu_prices(sessions), filters=filters)
    fleet = fleet.set_index("model").loc["(fleet)"]
    assert metrics["Cost per hour"] == f"${fleet['spend'] / view.span.total_seconds() * 3600:,.2f}"
    requests = request_totals(run_.client, view.start, view.end, by=["source"], source=None, filters=filters)
    per_s = requests.set_index("source").loc["gateway", "requests"] / view.span.total_seconds()
    assert metrics["Requests/s"] == f"{per_s:.2f}"  # the tenant's own requests under its filter


def _check_latency(at, run_, view, sessions, params, store) -> None:
    want = latency_over_time(run_.client, "ttft", view.start, view.end, levels=LEVELS, filters=_filters(params))
    drawn = _frames_with(at, "percentile", "value", "model")
    for source, frame in want.dropna(subset=["value"]).groupby("source"):
        values = sorted(frame["value"])
        assert any(
            len(f.dropna(subset=["value"])) == len(values)
            and sorted(f["value"].dropna()) == pytest.approx(values, rel=1e-6)
            for f in drawn
        ), source
        models = set(frame["model"])
        assert models == ({"tiny-large"} if params.get("model") else models)
    unapplied = want.attrs.get("unapplied", {}).get("engine histograms")
    said = " ".join(c.value for c in at.caption)
    assert ("cannot be filtered by tenant, route" in said) == bool(unapplied)


def _check_capacity(at, run_, view, sessions, params, store) -> None:
    plan = scale_out(run_.client, view.start, view.end, filters=_filters(params))
    boxes = [m.value for m in [*at.warning, *at.success, *at.info, *at.error]]
    assert {b.split("**")[1] for b in boxes if b.startswith("**")} == set(plan["model"])
    for row in plan.itertuples():
        assert any(b.startswith(f"**{row.model}**: {row.replicas} → {row.recommended} replicas") for b in boxes)


def _check_traffic(at, run_, view, sessions, params, store) -> None:
    want = request_totals(run_.client, view.start, view.end, by=["model"], filters=_filters(params))
    [drawn] = _frames_with(at, "per_s", "model")
    assert set(drawn.loc[drawn["per_s"] > 0, "model"]) == set(want.loc[want["requests"] > 0, "model"])


def _check_cost(at, run_, view, sessions, params, store) -> None:
    filters = _filters(params)
    spend = gpu_spend(run_.client, view.start, view.end, gpu_prices(sessions), filters=filters)
    assert {m.label: m.value for m in at.metric}["Spend"] == f"${spend['spend'].sum():,.2f}"
    showback = next(t.value for t in at.dataframe if "Tenant" in t.value.columns)
    tenants = cost_by_tenant(run_.client, view.start, view.end, gpu_prices(sessions), filters=filters)
    assert set(showback["Tenant"]) == set(tenants["tenant"])
    assert ("bigcorp" in set(showback["Tenant"])) and (set(showback["Tenant"]) == {"bigcorp"}) == bool(
        params.get("tenant")
    )


def _check_investigate(at, run_, view, sessions, params, store) -> None:
    ex = explain(
        run_.client, view.start, view.end, latency="ttft", q=0.99, prices=gpu_prices(sessions), filters=_filters(params)
    )
    said = [m.value for m in [*at.success, *at.info]]
    assert said and said[0].startswith(ex.sentence), (said, ex.sentence)


def _check_plan(at, run_, view, sessions, params, store) -> None:
    recorded = recorded_fleet(run_.client, max(view.start, view.end - timedelta(hours=1)), view.end)
    for pool in recorded.pools.values():  # the form starts from the fleet as it ran
        assert at.number_input(key=f"plan_replicas_{pool.model}").value == pool.replicas
    assert any(c.value.startswith("Replays the requests logged from") for c in at.caption)


def _check_alerts(at, run_, view, sessions, params, store) -> None:
    assert {m.label: m.value for m in at.metric}["Firing"] == "0"
    said = " ".join(c.value for c in at.caption)
    assert ("The sidebar's filters do not apply here" in said) == bool(params)


def _check_sql(at, run_, view, sessions, params, store) -> None:
    [shown] = [t.value for t in at.dataframe if "requests" in t.value.columns]
    query = at.text_area(key="sql_text").value
    expected = ReadOnlyRunner(f"chdb:{store}", database=run_.client.database).run(query, max_rows=1000)
    assert [tuple(r) for r in shown.itertuples(index=False)] == expected.rows
    said = " ".join(c.value for c in at.caption)
    assert ("filters do not apply here" in said) == bool(params)


def _check_fleet(at, run_, view, sessions, params, store) -> None:
    shown = next(t.value for t in at.dataframe if "Replica" in t.value.columns)
    up = gpu_hours(run_.client, view.start, view.end, filters=_filters(params))
    assert set(up["replica"]) <= set(shown["Replica"])
    assert set(shown["Replica"]) == ({"large-0"} if params.get("model") else {"small-0", "small-1", "large-0"})


CHECKS = {
    "overview": _check_overview,
    "latency": _check_latency,
    "capacity": _check_capacity,
    "traffic": _check_traffic,
    "cost": _check_cost,
    "investigate": _check_investigate,
    "plan": _check_plan,
    "alerts": _check_alerts,
    "sql": _check_sql,
    "fleet": _check_fleet,
}


@pytest.mark.parametrize("page", PAGES)
def test_every_page_shows_analytics_figures_for_its_filters(page: str, shift, sessions, chdb_dir) -> None:
    """A simulated run, with no filter, a model, and a tenant and route: each page says what it shows and its
    headline figures are what analytics computes for the same view."""
    use_stores(shift.client, sessions, on_store(chdb_dir))
    for params in FILTERS:
        at = run(page, **window(shift), **params)
        assert not at.exception, (params, at.exception)
        assert not at.error, (params, [e.value for e in at.error])
        said = at.caption[0].value  # the view: its window and its filters
        for key, value in params.items():
            assert f"{key} {value}" in said, (params, said)
        if page in CHECKS:  # a page not in CHECKS yet: rendered with its view named, no figure compared
            CHECKS[page](at, shift, read_view({**window(shift), **params}), sessions, params, chdb_dir)


def test_the_checks_of_each_page_name_pages_of_the_app() -> None:
    """EMPTY and CHECKS are keyed by the app's own list (dashboard.pages): a renamed page is not left unchecked."""
    assert set(EMPTY) <= set(PAGES) and set(CHECKS) <= set(PAGES)
