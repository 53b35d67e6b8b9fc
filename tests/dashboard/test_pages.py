"""Dashboard pages under Streamlit's AppTest: each renders without an exception on an empty store
and on a simulated tenant-shift run, with filters from the URL, and shows what ``analytics``
returns for the same view."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from adhoc.runner import ReadOnlyRunner
from adhoc.saved import save_query, saved_queries
from alerts import outbox
from alerts.model import fingerprint, parse_matchers
from alerts.state import Instance, Transition
from alerts.store import add_silence, save_evaluation, save_states, silences, write_events
from analytics.cost import cost_by_tenant, cost_per_token, gpu_spend
from analytics.cost_series import cost_breaks, cost_over_time
from analytics.drift import drift
from analytics.explain import explain, explain_cost
from analytics.filters import Filters
from analytics.metrics import histogram_quantile
from analytics.saturation import kv_over_time, scale_out
from analytics.timeseries import histogram_steps_and_window
from dashboard import pages
from dashboard.context import use_stores
from dashboard.view import read_view, view_params
from fleetscope.history import seed
from fleetscope.settings import load_settings
from migrations import clickhouse_runner
from storage.catalog import add_annotation, annotations_in, gpu_prices
from storage.clickhouse import connect
from tests.analytics.scenario_data import play
from tests.conftest import migrated_sessions

ROOT = Path(__file__).resolve().parents[2]
PAGES = [p.url_path for p in pages.PAGES]  # every page of the app (dashboard.pages), by the url path run() takes
TITLES = {p.url_path: p.title for p in pages.PAGES}
FILES = {p.url_path: p.path for p in pages.PAGES}


def run(page: str, **params: str) -> AppTest:
    at = AppTest.from_file(str(FILES[page]), default_timeout=60)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


@pytest.fixture
def sessions(sqlite_url: str):
    yield from migrated_sessions(sqlite_url)


@pytest.fixture(scope="module")
def shift(chdb_dir):
    return play(chdb_dir, "tenant-shift", seed=1)


def on_store(chdb_dir):
    """The bundled settings, with clickhouse.url on the tests' chDB store (the SQL page's runner opens it)."""
    return load_settings(ROOT / "fleetscope.yaml", environ={"FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{chdb_dir}"})


def window(run_) -> dict[str, str]:
    return {"from": run_.start.isoformat(), "to": run_.end.isoformat()}


def test_the_view_round_trips_through_the_query_string() -> None:
    now = datetime(2026, 11, 29, 12, 0, 7, tzinfo=UTC)
    view = read_view({"range": "6h", "refresh": "30", "model": "a,b", "tenant": "acme"}, now=now)
    assert view.end - view.start == timedelta(hours=6) and view.filters.model == ("a", "b")
    assert read_view(view_params(view), now=now) == view
    custom = read_view({"from": "2026-11-29T10:00:00Z", "to": "2026-11-29T11:00:00+00:00"}, now=now)
    assert (custom.range_key, custom.span) == ("custom", timedelta(hours=1))
    # a 30-day view moves by 10 minutes: refreshes within them read the same window (and the cache)
    month = read_view({"range": "30d"}, now=datetime(2026, 11, 29, 12, 9, 59, tzinfo=UTC))
    assert month.end == datetime(2026, 11, 29, 12, 0, tzinfo=UTC) and month.span == timedelta(days=30)
    # dashboard.max_grain_s caps it: a 30-day view that moves every 20 seconds
    fresher = read_view({"range": "30d"}, now=datetime(2026, 11, 29, 12, 9, 59, tzinfo=UTC), longest_grain=20)
    assert fresher.end == datetime(2026, 11, 29, 12, 9, 40, tzinfo=UTC)
    bad = read_view({"range": "2y", "refresh": "soon", "from": "yesterday"}, now=now)
    assert bad.range_key == "1h" and bad.refresh_s == 0 and len(bad.problems) == 2


def test_overview_shows_the_analytics_numbers(shift, sessions) -> None:
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("overview", **window(shift))
    metrics = {m.label: m.value for m in at.metric}
    view = read_view(window(shift))
    # over the window the sparkline's steps cover (the view widened to whole steps)
    covered = histogram_steps_and_window(
        shift.client, "vllm:time_to_first_token_seconds", (0.99,), view.start, view.end, "fleet"
    )[1].attrs["plan"]
    assert covered.start <= view.start and covered.end >= view.end
    p99 = histogram_quantile(
        shift.client, "vllm:time_to_first_token_seconds", 0.99, covered.start, covered.end, "fleet"
    )
    assert metrics["p99 TTFT"] == f"{p99['quantile'].iloc[0]:.3f} s"
    assert metrics["Replicas reporting"] == "3"
    fleet = cost_per_token(shift.client, view.start, view.end, gpu_prices(sessions)).set_index("model").loc["(fleet)"]
    assert metrics["Cost per hour"] == f"${fleet['spend'] / view.span.total_seconds() * 3600:,.2f}"


def test_cost_page_offers_the_showback_as_csv(shift, sessions) -> None:
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("cost", **window(shift))
    assert not at.exception
    tables = [t.value for t in at.dataframe]
    showback = next(t for t in tables if "Tenant" in t.columns)
    assert "bigcorp" in set(showback["Tenant"])
    # the showback's dollars, as analytics computes them, to 4 significant digits
    view = read_view(window(shift))
    want = cost_by_tenant(shift.client, view.start, view.end, gpu_prices(sessions)).set_index("tenant")["spend"]
    shown = showback.set_index("Tenant")["Spend ($)"]
    assert shown.to_dict() == pytest.approx(want.loc[shown.index].to_dict(), rel=5e-4)
    assert any(b.label == "Download CSV" for b in at.get("download_button"))
    # the simulated engines report each response's cached tokens: the showback's add up to the engines' own,
    # and the page has nothing to explain about them
    engines = cost_per_token(shift.client, view.start, view.end, gpu_prices(sessions)).set_index("model")
    assert want.index.size and showback["Cached prompt tokens"].sum() == pytest.approx(
        engines.loc["(fleet)", "cached_tokens"], rel=0.02
    )
    assert not [c.value for c in at.caption if c.value.startswith("Cached prompt tokens")]


def test_the_cost_page_says_once_which_cached_tokens_it_uses_where_responses_report_none(chdb_dir, sessions) -> None:
    # engines started without --enable-prompt-tokens-details: each response says 0 cached tokens
    steady = play(chdb_dir, "steady", seed=2)
    steady.client.command("ALTER TABLE requests UPDATE cached_tokens = 0 WHERE 1 SETTINGS mutations_sync = 1")
    use_stores(steady.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("cost", **window(steady))
    assert not at.exception and not at.error
    [said] = [c.value for c in at.caption if c.value.startswith("Cached prompt tokens")]
    assert "--enable-prompt-tokens-details" in said and "prices every tenant's prompt tokens as computed" in said
    engines = cost_per_token(steady.client, steady.start, steady.end, gpu_prices(sessions))
    assert f"{engines.set_index('model').loc['(fleet)', 'cached_tokens']:,.0f}" in said


def test_a_store_that_cannot_be_read_is_one_clear_error(ch, sessions) -> None:
    use_stores(ch, sessions, None)  # a database never migrated: no tables
    at = run("overview", range="1h")
    assert not at.exception
    assert at.error and "cannot be read" in at.error[0].value


def test_capacity_page_shows_the_scale_out_recommendation(shift, sessions) -> None:
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("capacity", **window(shift))
    assert not at.exception
    view = read_view(window(shift))
    plan = scale_out(shift.client, view.start, view.end)
    assert len(plan) == 2  # the bundled fleet's two model pools
    boxes = " ".join(m.value for m in [*at.warning, *at.success, *at.info])
    for row in plan.itertuples():
        assert f"**{row.model}**: {row.replicas} → {row.recommended} replicas" in boxes
        assert row.reasons[0] in boxes


def test_capacity_and_fleet_pages_name_a_stalled_replica(chdb_dir, sessions) -> None:
    frozen = play(chdb_dir, "engine-stall", seed=1)  # small-1 freezes at 180 s, goes on at 540 s
    use_stores(frozen.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    during = {"from": frozen.start.isoformat(), "to": (frozen.start + timedelta(minutes=7)).isoformat()}
    at = run("capacity", **during)
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(e.startswith("**small-1** (tiny-small) is stalled") for e in errors), errors
    advice = next(e for e in errors if e.startswith("**tiny-small**"))  # the pool's advice, an error box
    assert "stalled (small-1)" in advice and "no action" not in advice
    assert any(m.value.startswith("**tiny-large**") and "no action" in m.value for m in at.success)
    at = run("fleet", **during)
    assert not at.exception
    assert any(e.value.startswith("replica small-1 is stalled since") for e in at.error)
    table = at.dataframe[0].value.set_index("Replica")
    assert table.loc["small-1", "Stalled"].startswith("now, ") and table.loc["small-0", "Stalled"] == ""


def chart_frames(at: AppTest) -> list:
    """The data of every chart on the page, as pandas frames."""
    return [
        pa.ipc.open_stream(d.data.data).read_all().to_pandas()
        for chart in at.get("vega_lite_chart")
        for d in chart.proto.datasets
        if d.data.data
    ]


def test_a_replica_silent_for_minutes_draws_a_gap_not_a_line_across(chdb_dir, sessions) -> None:
    crash = play(chdb_dir, "replica-crash", seed=2)  # small-1 killed at 120 s, back at 300 s: no scrapes between
    use_stores(crash.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    killed, back = crash.start + timedelta(seconds=120), crash.start + timedelta(seconds=300)
    at = run("capacity", **window(crash))
    assert not at.exception
    lines = [
        f
        for f in chart_frames(at)
        if {"replica", "ts"} <= set(f.columns) and {"requests", "preemptions_per_s", "prefix_hit_rate"} & set(f.columns)
    ]
    assert len(lines) == 3  # requests waiting and running, preemptions, prefix-cache hit rate
    for frame in lines:
        value = next(c for c in ("requests", "preemptions_per_s", "prefix_hit_rate") if c in frame)
        ts = pd.to_datetime(frame["ts"], utc=True)
        hole = frame[(frame["replica"] == "small-1") & (ts > killed) & (ts < back)]
        # inside the hole only empty points (the path breaks on them), and at least one of them
        assert len(hole) and hole[value].isna().all(), (value, hole)
        others = frame[(frame["replica"] == "small-0") & (ts > killed + timedelta(minutes=1)) & (ts < back)]
        assert others[value].notna().any()  # the replica that served on is drawn through


def test_capacity_heatmap_shows_the_hottest_replicas_of_a_large_fleet(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    seed(ch, replicas=40, days=1.25, raw_hours=0.25, minute_hours=2)
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("capacity", range="24h")
    assert not at.exception
    view = read_view({"range": "24h"})
    per_replica = kv_over_time(ch, view.start, view.end, "replica")
    peaks = per_replica.groupby("replica")["kv_max"].max()
    heat = at.get("vega_lite_chart")[0]
    shown = set().union(
        *(
            set(pa.ipc.open_stream(d.data.data).read_all().column("replica").to_pylist())
            for d in heat.proto.datasets
            if b"replica" in d.data.data
        )
    )
    assert len(peaks) == 40 and len(shown) == 30  # a row per replica only for the 30 that came closest to full
    assert min(peaks[list(shown)]) >= max(peaks.drop(list(shown)))
    assert any("30 of 40 replicas with the highest peak" in c.value for c in at.caption)


def test_cost_chart_shows_the_costliest_replicas_of_a_large_fleet(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    seed(ch, replicas=40, days=1.25, raw_hours=0.25, minute_hours=2)
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("cost", range="24h")
    assert not at.exception and not at.error
    view = read_view({"range": "24h"})
    spend = gpu_spend(ch, view.start, view.end, gpu_prices(sessions)).set_index("replica")
    total = spend["busy_spend"] + spend["idle_spend"]
    # the spend-by-replica bars (the chart above them is the cost per token over time)
    [bars] = [
        c
        for c in at.get("vega_lite_chart")
        if any("usd" in pa.ipc.open_stream(d.data.data).schema.names for d in c.proto.datasets if d.data.data)
    ]
    shown = set().union(
        *(
            set(pa.ipc.open_stream(d.data.data).read_all().column("replica").to_pylist())
            for d in bars.proto.datasets
            if b"replica" in d.data.data
        )
    )
    assert len(total) == 40 and len(shown) == 30  # a bar for each of the 30 that cost the most
    assert min(total[list(shown)]) >= max(total.drop(list(shown)))
    assert any(c.value.startswith("The 30 of 40 replicas that cost the most") for c in at.caption)


def test_traffic_page_counts_the_drifted_features_as_analytics_does(shift, sessions) -> None:
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    # the onboarding phase against the steady phase before it: a custom window whose trailing day holds the start
    params = {"from": shift.phase("bigcorp-onboarded").isoformat(), "to": shift.end.isoformat()}
    at = run("traffic", **params)
    assert not at.exception and not at.error
    view = read_view(params)
    table = drift(shift.client, (view.start, view.end), "trailing-day")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Features drifted"] == f"{int(table['drifted'].sum())} of {len(table)}"
    assert table.set_index("feature").loc["tenant", "drifted"]  # bigcorp arrived
    shown = next(t.value for t in at.dataframe if "Feature" in t.value.columns)
    assert list(shown["Feature"]) == list(table["feature"])


def test_investigate_page_tells_the_explanation_analytics_finds(shift, sessions) -> None:
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("investigate", **window(shift), metric="ttft", q="0.99")
    assert not at.exception
    view = read_view(window(shift))
    ex = explain(shift.client, view.start, view.end, latency="ttft", q=0.99, prices=gpu_prices(sessions))
    assert at.success[0].value == ex.sentence and ex.break_at is not None
    evidence = next(t.value for t in at.dataframe if "Signal" in t.value.columns)
    assert list(evidence["Signal"]) == list(ex.evidence["signal"])
    # the quantile line, drawn before the explanation was worked out, was redrawn with the break marked
    charts = at.get("vega_lite_chart")
    assert any(b"latency break" in d.data.data for d in charts[0].proto.datasets)
    assert (
        sum(1 for c in charts for d in c.proto.datasets if b"latency break" in d.data.data) == len(charts) - 1
    )  # not the BubbleUp
    # the KV chart aligned on the break draws the capacity signals the evidence was judged on
    frames = [
        pa.ipc.open_stream(d.data.data).read_all().to_pandas()
        for c in at.get("vega_lite_chart")
        for d in c.proto.datasets
        if b"engines' average" in d.data.data
    ]
    drawn = frames[0].set_index("of").loc["engines' average"].set_index("ts")["used"]
    want = ex.capacity["kv_avg"].dropna()
    assert len(want) > 10 and drawn.to_numpy() == pytest.approx(want.to_numpy())
    # the cost of the two periods, on request
    assert not [t for t in at.dataframe if "Period" in t.value.columns]
    at.toggle(key="inv_cost").set_value(True).run()
    cost = next(t.value for t in at.dataframe if "Period" in t.value.columns)
    assert list(cost["Period"]) == list(ex.cost["period"]) and set(cost["Period"]) == {"before", "after"}
    assert cost["Spend ($)"].to_numpy() == pytest.approx(ex.cost["spend"].to_numpy(), rel=5e-4)  # 4 digits


@pytest.fixture(scope="module")
def router(chdb_dir):
    return play(chdb_dir, "router-shift", seed=1)  # acme's prompts pass the router's rule at +12 min


def test_investigate_explains_a_tenants_cost_rise_with_a_waterfall_that_adds_up(router, sessions) -> None:
    use_stores(router.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("investigate", **window(router), metric="cost", tenant="globex")
    assert not at.exception, at.exception
    view = read_view({**window(router), "tenant": "globex"})
    ex = explain_cost(router.client, view.start, view.end, gpu_prices(sessions), filters=Filters(tenant="globex"))
    assert ex.break_at is not None and at.success[0].value == ex.sentence
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Before"] == f"${ex.before:,.4g} / 1M" and metrics["After"] == f"${ex.after:,.4g} / 1M"
    # the waterfall: before, each driver's step, after; the steps land exactly on the after level
    bars = next(
        pa.ipc.open_stream(d.data.data).read_all().to_pandas()
        for c in at.get("vega_lite_chart")
        for d in c.proto.datasets
        if d.data.data and b"label" in d.data.data and b"kind" in d.data.data
    ).sort_values("order")
    assert list(bars["label"])[0] == "before" and list(bars["label"])[-1] == "after"
    steps = bars.iloc[1:-1]
    assert steps["end"].iloc[-1] == pytest.approx(ex.after, rel=1e-9)
    assert steps["start"].iloc[1:].to_numpy() == pytest.approx(steps["end"].iloc[:-1].to_numpy())
    assert "volume: tiny-small" in set(steps["label"])
    evidence = next(t.value for t in at.dataframe if "Change per 1M tokens ($)" in t.value.columns)
    assert list(evidence["Pool"]) == list(ex.evidence["pool"])
    movers = next(t.value for t in at.dataframe if "To pool" in t.value.columns)
    assert movers.iloc[0]["Tenant"] == "acme" and movers.iloc[0]["To pool"] == "tiny-large"
    # the selectbox offers the cost with the latencies, and knows it came from the link
    assert at.selectbox(key="inv_latency").value == "cost"


def test_the_cost_page_charts_cost_per_token_by_tenant_and_links_each_rise(router, sessions) -> None:
    use_stores(router.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("cost", **window(router))
    assert not at.exception, at.exception
    at.radio(key="cost_by").set_value("tenant").run()
    assert not at.exception, at.exception
    view = read_view(window(router))
    series = cost_over_time(router.client, view.start, view.end, gpu_prices(sessions), by="tenant")
    drawn = next(
        pa.ipc.open_stream(d.data.data).read_all().to_pandas()
        for c in at.get("vega_lite_chart")
        for d in c.proto.datasets
        if d.data.data and b"cost_per_million_tokens" in d.data.data and b"tenant" in d.data.data
    ).dropna(subset=["cost_per_million_tokens"])
    want = series.dropna(subset=["cost_per_million_tokens"])
    assert set(drawn["tenant"]) == set(want["tenant"]) >= {"acme", "globex", "initech"}
    assert sorted(drawn["cost_per_million_tokens"]) == pytest.approx(sorted(want["cost_per_million_tokens"]))
    # globex pays for acme's move: its rise is said, timed near the shift, and links to its explanation
    switch = router.phase("acme-long-prompts")
    said = [m.value for m in at.markdown if "explain it" in m.value]
    globex = next(s for s in said if "tenant globex" in s)
    assert "metric=cost" in globex and "tenant=globex" in globex
    rises = cost_breaks(series, "tenant").set_index("tenant")
    assert abs((pd.Timestamp(rises.loc["globex", "break_at"]) - pd.Timestamp(switch)).total_seconds()) <= 2 * int(
        series.attrs["step"]
    )
    # acme's own cost fell when its requests moved to the busier pool: its rise comes when they move back
    assert pd.Timestamp(rises.loc["acme", "break_at"]) >= pd.Timestamp(router.phase("acme-back"))
    assert len(said) == len(rises)


def test_fleet_page_names_a_failing_scrape_and_keeps_annotations(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    failed_at = datetime.now(UTC) - timedelta(minutes=3)
    ch.insert(
        "scrapes",
        [
            [failed_at - timedelta(minutes=2), "vllm", "127.0.0.1:9", "r9", 1, 0.01, 120, ""],
            [failed_at, "vllm", "127.0.0.1:9", "r9", 0, 0.0, 0, "connection refused"],
        ],
        column_names=["ts", "job", "instance", "replica", "up", "duration_seconds", "samples_scraped", "error"],
    )
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("fleet", range="15m")
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(
        e.startswith("no data from replica r9 since") and e.endswith("scrape failing: connection refused")
        for e in errors
    ), errors
    at.text_input[0].input("deploy vllm 0.32.1")
    at = at.get("form_submit_button")[0].click().run()
    assert not at.exception
    marks = annotations_in(sessions, datetime.now(UTC) - timedelta(days=1), datetime.now(UTC) + timedelta(days=1))
    assert [m.title for m in marks] == ["deploy vllm 0.32.1"]
    assert any("deploy vllm 0.32.1" in m.value for m in at.markdown)


def test_annotations_show_on_time_charts(shift, sessions) -> None:
    add_annotation(sessions, shift.phase("bigcorp-onboarded"), "onboard bigcorp")
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("capacity", **window(shift))
    charts = at.get("vega_lite_chart")
    # the mark's title travels in the chart's data (Arrow), beside the rule layer in its spec
    marked = [c for c in charts if any(b"onboard bigcorp" in d.data.data for d in c.proto.datasets)]
    assert marked and all('"rule"' in c.proto.spec for c in marked)
    assert len(marked) == len([c for c in charts if "temporal" in c.proto.spec])  # every time chart


# --------------------------------------------------------------------------- alerts


def seed_alerts(ch, sessions) -> datetime:
    """Through the alerting package's own writers: two firing instances, one pending, one resolved; the firing
    one's state changes in ClickHouse; one delivered and one failed notification; one active silence."""
    now = datetime.now(UTC)

    def inst(labels: dict[str, str], state: str, summary: str, value: float | None, began: timedelta) -> Instance:
        at = now - began
        return Instance(
            fingerprint(labels),
            labels,
            {"summary": summary},
            state,
            value,
            active_at=at,
            fired_at=at if state in ("firing", "resolved") else None,
            last_true_at=now - timedelta(seconds=15),
            resolved_at=now - timedelta(minutes=2) if state == "resolved" else None,
            evaluated_at=now,
        )

    kv = {"alertname": "KVCacheSaturated", "replica": "small-0", "severity": "page"}
    kv1 = {**kv, "replica": "small-1"}
    ttft = {"alertname": "TTFTOverSLO", "model": "tiny-small", "metric": "ttft", "slo": "ttft p99 < 1s"}
    itl = {"alertname": "ITLOverSLO", "model": "tiny-large", "metric": "itl", "slo": "itl p99 < 50ms"}
    save_states(
        sessions,
        {
            "KVCacheSaturated": {
                fingerprint(kv): inst(kv, "firing", "KV cache of small-0 at 97%", 0.97, timedelta(minutes=20)),
                fingerprint(kv1): inst(kv1, "firing", "KV cache of small-1 at 95%", 0.95, timedelta(minutes=5)),
            },
            "TTFTOverSLO": {
                fingerprint(ttft): inst(
                    ttft, "pending", "time to first token of tiny-small at 1.4x its SLO", 1.4, timedelta(minutes=1)
                )
            },
            "ITLOverSLO": {
                fingerprint(itl): inst(
                    itl, "resolved", "inter-token latency of tiny-large back", 0.8, timedelta(minutes=30)
                )
            },
        },
    )
    began = now - timedelta(minutes=20)
    write_events(
        ch,
        [
            (
                "KVCacheSaturated",
                Transition(
                    fingerprint(kv), kv, {"summary": "KV cache of small-0 at 97%"}, "inactive", "pending", 0.97, began
                ),
            ),
            (
                "KVCacheSaturated",
                Transition(
                    fingerprint(kv),
                    kv,
                    {"summary": "KV cache of small-0 at 97%"},
                    "pending",
                    "firing",
                    0.97,
                    began + timedelta(minutes=1),
                ),
            ),
        ],
    )
    outbox.enqueue(
        sessions, "route0:kv:1", "ops-slack", {"text": "KVCacheSaturated firing"}, now - timedelta(minutes=19)
    )
    outbox.mark_delivered(sessions, "route0:kv:1", now - timedelta(minutes=19), 200)
    outbox.enqueue(sessions, "route0:kv:2", "oncall-pd", {"routing_key": "SECRET"}, now - timedelta(minutes=10))
    outbox.mark_failed(sessions, "route0:kv:2", 400, "HTTP 400: invalid routing key")
    add_silence(
        sessions,
        parse_matchers('alertname="KVCacheSaturated", replica="small-1"'),
        now - timedelta(minutes=3),
        now + timedelta(hours=1),
        "ana",
        "draining small-1 for a driver update",
    )
    save_evaluation(sessions, "capacity", now - timedelta(seconds=5), 0.042, 3, {})
    save_evaluation(
        sessions,
        "team-sql",
        now - timedelta(seconds=9),
        0.01,
        1,
        {"QueueSQL": "SQL failed: Code: 60. Unknown table default.queue"},
    )
    return now


def test_alerts_page_without_an_evaluator_says_it_has_not_run(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("alerts", range="1h")
    assert not at.exception and not at.error
    assert {m.label: m.value for m in at.metric} == {
        "Firing": "0",
        "Pending": "0",
        "Active silences": "0",
        "Notifications pending or failed": "0",
    }
    infos = " ".join(i.value for i in at.info)
    assert "No alert is firing or pending" in infos and "`fleetscope alerts run`" in infos
    assert "No alert changed state" in infos and "No notification yet" in infos
    assert {m.label: m.value for m in run("overview", range="1h").metric}["Firing alerts"] == "0"  # zero, not "–"


def test_alerts_page_shows_what_the_evaluator_left(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    now = seed_alerts(ch, sessions)
    add_annotation(sessions, now - timedelta(minutes=25), "deploy vllm 0.32.1")
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("alerts", range="1h")
    assert not at.exception
    # the evaluator's health: the rule that failed last time, named with its error
    [failing] = [e.value for e in at.error]
    assert "team-sql/QueueSQL" in failing and "Unknown table default.queue" in failing
    groups = next(t.value for t in at.dataframe if "failing rules" in t.value.columns)
    assert dict(zip(groups["group"], groups["failing rules"], strict=True)) == {"capacity": 0, "team-sql": 1}
    assert {m.label: m.value for m in at.metric} == {
        "Firing": "2",
        "Pending": "1",
        "Active silences": "1",
        "Notifications pending or failed": "1",
    }
    tables = [t.value for t in at.dataframe]
    now_ = next(t for t in tables if "since" in t.columns)
    assert list(now_["state"]) == ["firing", "firing", "pending"]  # firing first, newest first
    assert list(now_["alert"]) == ["KVCacheSaturated", "KVCacheSaturated", "TTFTOverSLO"]
    assert "KV cache of small-1 at 95%" in set(now_["summary"])
    assert "replica=small-0, severity=page" in set(now_["labels"])
    assert list(now_["silenced"]) == [True, False, False]  # small-1 is silenced
    assert (
        now_["investigate"].iloc[2].startswith("investigate?metric=ttft&from=")
        and "model=tiny-small" in now_["investigate"].iloc[2]
    )
    resolved = next(t for t in tables if "resolved" in t.columns)
    assert list(resolved["alert"]) == ["ITLOverSLO"] and "metric=itl" in resolved["investigate"].iloc[0]
    changes = next(t for t in tables if "change" in t.columns)
    assert list(changes["change"]) == ["pending → firing", "inactive → pending"]
    [timeline] = [c for c in at.get("vega_lite_chart") if '"point"' in c.proto.spec]  # the history chart
    assert '"rule"' in timeline.proto.spec  # with the annotations, as every time chart
    assert any('alertname="KVCacheSaturated", replica="small-1"' in m.value and "ana" in m.value for m in at.markdown)
    log = next(t for t in tables if "receiver" in t.columns)
    assert list(log["receiver"]) == ["oncall-pd", "ops-slack"] and list(log["status"]) == ["failed", "delivered"]
    assert list(log["last HTTP status"]) == ["400", "200"] and "invalid routing key" in log["error"].iloc[0]
    overview = run("overview", range="1h")  # the Overview counts the same firing alerts
    assert not overview.exception
    assert {m.label: m.value for m in overview.metric}["Firing alerts"] == "2"


def test_overview_counts_firing_alerts_with_engine_metrics(shift, sessions) -> None:
    seed_alerts(shift.client, sessions)
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("overview", **window(shift))
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Firing alerts"] == "2" and metrics["Replicas reporting"] == "3"


def test_a_silence_is_created_from_the_form_and_expired(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("alerts", range="1h")
    form = {t.key: t for t in at.text_input}
    form["silence_matchers"].input('alertname="KVCacheSaturated", replica="small-0"')
    form["silence_author"].input("ana")
    form["silence_comment"].input("driver update on small-0")
    at.selectbox(key="silence_duration").set_value("4h")
    at = at.get("form_submit_button")[0].click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    [made] = silences(sessions)
    assert [str(m) for m in made.matchers] == ['alertname="KVCacheSaturated"', 'replica="small-0"']
    assert (made.created_by, made.comment) == ("ana", "driver update on small-0")
    assert timedelta(hours=4) - timedelta(seconds=5) < made.ends_at - datetime.now(UTC) <= timedelta(hours=4)
    assert at.success and f"Silence #{made.id} created" in at.success[0].value
    assert {m.label: m.value for m in at.metric}["Active silences"] == "1"  # shown at once, not after the cache expires
    assert at.text_input(key="silence_matchers").value == ""  # the form is ready for the next one

    # a matcher that cannot be read: an error, nothing saved, what was typed stays
    at.text_input(key="silence_matchers").input('alertname="KVCacheSaturated", replica=~"small-(0"')
    at.text_input(key="silence_comment").input("typo")
    at = at.get("form_submit_button")[0].click().run()
    assert not at.exception
    assert at.error and at.error[0].value.startswith("Not saved:") and "regular expression" in at.error[0].value
    assert at.text_input(key="silence_comment").value == "typo"
    at.text_input(key="silence_matchers").input("")
    at = at.get("form_submit_button")[0].click().run()
    assert at.error and "at least one matcher" in at.error[0].value
    assert len(silences(sessions)) == 1

    at = at.button(key=f"expire_{made.id}").click().run()
    assert not at.exception and not at.error
    [ended] = silences(sessions)
    assert ended.ends_at <= datetime.now(UTC) and not ended.active(datetime.now(UTC))
    assert f"Silence #{made.id} expired." in at.success[0].value
    assert {m.label: m.value for m in at.metric}["Active silences"] == "0"
    assert not [b for b in at.button if b.key == f"expire_{made.id}"]  # listed with the ended ones, no button
    ended_table = next(t.value for t in at.dataframe if "matchers" in t.value.columns)
    assert list(ended_table["id"]) == [made.id]


# --------------------------------------------------------------------------- sql

PER_MINUTE = (
    "SELECT toStartOfMinute(ts) AS minute, model, count() AS n FROM requests GROUP BY minute, model "
    "ORDER BY minute, model"
)


@pytest.fixture
def media(monkeypatch):
    """The files AppTest's runs hand to download buttons (its media store is dropped after each run)."""
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
    from streamlit.testing.v1 import app_test

    stores: list[MemoryMediaFileStorage] = []

    class Kept(MemoryMediaFileStorage):
        def __init__(self, endpoint: str) -> None:
            super().__init__(endpoint)
            stores.append(self)

    monkeypatch.setattr(app_test, "MemoryMediaFileStorage", Kept)

    def read(url: str) -> bytes:
        return stores[-1].get_file(url.rsplit("/", 1)[-1]).content

    return read


def run_sql(at: AppTest, sql: str, **widgets: object) -> AppTest:
    at.text_area(key="sql_text").input(sql)
    for key, value in widgets.items():
        at.number_input(key=key).set_value(value)
    return next(b for b in at.get("form_submit_button") if b.label == "Run").click().run()


def test_sql_page_runs_a_query_as_the_runner_does(shift, sessions, chdb_dir, media) -> None:
    use_stores(shift.client, sessions, on_store(chdb_dir))
    at = run("sql", **window(shift))
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "toStartOfHour(ts)" in at.text_area(key="sql_text").value  # the example query, run on the first render
    at = run_sql(at, PER_MINUTE)
    assert not at.exception and not at.error, [e.value for e in at.error]
    expected = ReadOnlyRunner(f"chdb:{chdb_dir}", database=shift.client.database).run(PER_MINUTE, max_rows=1000)
    assert expected.rows and not expected.truncated
    [table] = [t.value for t in at.dataframe if "minute" in t.value.columns]
    assert list(table.columns) == ["minute", "model", "n"]
    assert [tuple(r) for r in table.itertuples(index=False)] == expected.rows  # the value the user sees
    assert any(c.value.startswith(f"{len(expected.rows):,} rows in ") and c.value.endswith(" ms") for c in at.caption)
    charts = at.get("vega_lite_chart")
    assert charts and all('"temporal"' in c.proto.spec and '"utc"' in c.proto.spec for c in charts)
    [download] = [b for b in at.get("download_button") if b.label == "Download CSV"]
    lines = list(csv.reader(io.StringIO(media(download.proto.url).decode())))
    assert lines[0] == ["minute", "model", "n"] and len(lines) - 1 == len(expected.rows)
    assert at.query_params["q"] == PER_MINUTE  # the query is in the link, to send

    # the row limit cuts the result, and says so
    at = run_sql(at, PER_MINUTE, sql_limit=3)
    assert [len(t.value) for t in at.dataframe if "minute" in t.value.columns] == [3]
    assert any("cut at the row limit (3)" in c.value for c in at.caption)


def test_sql_page_refuses_a_write_and_says_why(ch, sessions, chdb_dir) -> None:
    clickhouse_runner.apply(ch)
    ch.insert("requests", [[datetime.now(UTC), "tiny-small"]], column_names=["ts", "model"])
    use_stores(ch, sessions, on_store(chdb_dir))
    at = run_sql(run("sql", range="1h"), "DROP TABLE requests")
    assert not at.exception
    [error] = [e.value for e in at.error]
    assert error.startswith("Refused:") and "DROP" in error
    assert ch.query("SELECT count() FROM requests").result_rows == [(1,)]  # still there, row and all
    at = run_sql(at, "SELECT no_such_column FROM requests")
    assert at.error and at.error[0].value.startswith("The query failed:") and "no_such_column" in at.error[0].value


def test_sql_page_saves_loads_and_deletes_queries(ch, sessions, chdb_dir) -> None:
    clickhouse_runner.apply(ch)
    save_query(
        sessions,
        "hourly",
        "SELECT toStartOfHour(ts) AS hour, count() AS n FROM requests GROUP BY hour",
        "requests per hour",
        "bo",
    )  # elsewhere, e.g. by another user
    use_stores(ch, sessions, on_store(chdb_dir))
    at = run("sql", range="1h")
    assert not at.exception
    assert at.selectbox(key="sql_saved").options == ["hourly"]
    at.text_area(key="sql_text").input(PER_MINUTE)
    at.text_input(key="sql_save_name").input("per minute")
    at.text_input(key="sql_save_description").input("requests per minute by model")
    at.text_input(key="sql_save_author").input("ana")
    at = next(b for b in at.get("form_submit_button") if b.label == "Save query").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    kept = next(q for q in saved_queries(sessions) if q.name == "per minute")
    assert (kept.name, kept.sql, kept.description, kept.created_by) == (
        "per minute",
        PER_MINUTE,
        "requests per minute by model",
        "ana",
    )
    assert at.success and "per minute" in at.success[0].value
    assert at.selectbox(key="sql_saved").value == "per minute"
    assert at.text_input(key="sql_save_name").value == ""  # the form is ready for the next one

    # a statement the check refuses is not kept
    at.text_area(key="sql_text").input("DELETE FROM requests WHERE 1")
    at.text_input(key="sql_save_name").input("wipe")
    at = next(b for b in at.get("form_submit_button") if b.label == "Save query").click().run()
    assert not at.exception
    assert at.error and at.error[0].value.startswith("Not saved:")
    assert [q.name for q in saved_queries(sessions)] == ["hourly", "per minute"]

    # loading one puts its text in the editor, runs it and shows its description
    at = at.selectbox(key="sql_saved").set_value("hourly").run()
    assert not at.exception and not at.error
    assert at.text_area(key="sql_text").value.startswith("SELECT toStartOfHour(ts) AS hour, count() AS n")
    assert any(c.value.startswith("requests per hour — bo") for c in at.caption)

    at = at.button(key="sql_delete").click().run()
    assert not at.exception and not at.error
    assert [q.name for q in saved_queries(sessions)] == ["per minute"]
    assert "Deleted" in at.success[0].value and at.selectbox(key="sql_saved").value is None


def test_sql_page_lists_the_tables_and_their_columns(ch, sessions, chdb_dir) -> None:
    clickhouse_runner.apply(ch)
    use_stores(ch, sessions, on_store(chdb_dir))
    at = run("sql", range="1h")
    assert not at.exception
    requests = next(e for e in at.expander if e.label.startswith("**requests** ·"))
    [text] = [m.value for m in requests.markdown]
    head, rule, *rows = text.splitlines()
    assert head == "| Column | Type | Comment |"
    cells = {row.split(" | ")[0].strip("| ").replace("\\", ""): row.split(" | ")[1] for row in rows}
    assert {"ts", "model", "tenant"} <= set(cells)
    assert cells["ts"].startswith("DateTime") and "'UTC'" in cells["ts"]


def test_the_filters_box_narrows_the_page_and_says_so(shift, sessions) -> None:
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    # the last hour: the played series rows were written now, so the filter boxes offer them here
    at = run("overview", range="1h")
    assert {m.label: m.value for m in at.metric}["Replicas reporting"] == "3"
    assert [p.proto.popover.label for p in at.get("popover")] == ["Filters"]
    at.multiselect(key="f_model").select("tiny-large").run()
    assert not at.exception
    assert at.query_params["model"] == "tiny-large"  # the view, shareable as a link
    assert {m.label: m.value for m in at.metric}["Replicas reporting"] == "1"
    assert any(c.value.endswith(" · model tiny-large") for c in at.caption)  # the page says what it shows
    assert [p.proto.popover.label for p in at.get("popover")] == ["Filters (1)"]


@pytest.mark.parametrize("page", ["overview", "capacity", "traffic", "cost", "fleet"])
def test_a_page_read_at_once_on_several_clients_shows_what_it_shows_read_in_turn(
    page: str, shift, sessions, chdb_dir
) -> None:
    settings = load_settings(ROOT / "fleetscope.yaml", environ={})
    shown = {}
    for readers in ([], [connect(f"chdb:{chdb_dir}", database=shift.client.database) for _ in range(3)]):
        use_stores(shift.client, sessions, settings, readers)
        st.cache_data.clear()  # each way reads the store itself
        at = run(page, **window(shift))
        assert not at.exception, at.exception
        shown[len(readers)] = (
            [(m.label, m.value) for m in at.metric],
            [t.value.to_csv() for t in at.dataframe],
            [frame.to_csv() for frame in chart_frames(at)],
            [c.value for c in at.caption],
        )
    assert shown[0] == shown[3]
    assert shown[0][0] or shown[0][1] or shown[0][2]  # the page showed numbers


def test_plan_page_replays_the_window_against_the_fleet_picked_in_its_form(shift, sessions, chdb_dir) -> None:
    use_stores(shift.client, sessions, on_store(chdb_dir))
    at = run("plan", **window(shift))
    assert not at.exception, at.exception
    assert not at.dataframe  # nothing replayed before the form is sent
    at.number_input(key="plan_replicas_tiny-small").set_value(4)
    at = at.button[0].click().run(timeout=180)
    assert not at.exception, at.exception
    shown = at.dataframe[0].value
    fleets = list(shown["Fleet"])
    assert fleets[:2] == ["recorded (observed)", "recorded (replayed)"] and fleets[2].startswith("tiny-small=4")
    replayed, four = shown.set_index("Fleet").loc[fleets[1]], shown.set_index("Fleet").loc[fleets[2]]
    # two small replicas more: the replay says what they cost and what they buy
    assert four["Spend per hour ($)"] > replayed["Spend per hour ($)"]
    assert four["p99 TTFT tiny-small"] <= replayed["p99 TTFT tiny-small"]
    assert any("replayed as it ran" in c.value for c in [*at.caption, *at.warning])


def test_capacity_page_says_why_the_prefix_cache_missed_and_replays_its_advice(shift, sessions, chdb_dir) -> None:
    use_stores(shift.client, sessions, on_store(chdb_dir))
    at = run("capacity", **window(shift))
    assert not at.exception, at.exception
    said = " ".join(c.value for c in at.caption)
    assert "Modelled hit rate" in said and "of the misses were routing misses" in said
    misses = next(t.value for t in at.dataframe if "Routing misses (tokens)" in t.value.columns)
    assert set(misses["Replica"]) >= {"small-0", "small-1"}
    # the recommendation changes the fleet (one small replica fewer on this run): its replay says what that does
    toggles = [t for t in at.toggle if t.key == "capacity_replay"]
    assert toggles, [b.value for b in [*at.warning, *at.success, *at.info]]
    at = toggles[0].set_value(True).run(timeout=180)
    assert not at.exception, at.exception
    replayed = [i.value for i in at.info if i.value.startswith("Replayed from")]
    assert replayed and "tiny-small at 1 replica:" in replayed[0] and "−$" in replayed[0], [i.value for i in at.info]
