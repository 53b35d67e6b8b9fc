"""Dashboard pages under Streamlit's AppTest: each renders without an exception on an empty store
and on a simulated tenant-shift run, with filters from the URL, and shows what ``analytics``
returns for the same view."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st

from analytics.cost import cost_by_tenant, cost_per_token, gpu_spend
from analytics.cost_series import cost_breaks, cost_over_time
from analytics.drift import drift
from analytics.explain import explain, explain_cost
from analytics.filters import Filters
from analytics.metrics import histogram_quantile
from analytics.saturation import kv_over_time, scale_out
from analytics.timeseries import histogram_steps_and_window
from dashboard.context import use_stores
from dashboard.view import read_view, view_params
from fleetscope.history import seed
from fleetscope.settings import load_settings
from migrations import clickhouse_runner
from storage.catalog import add_annotation, annotations_in, gpu_prices
from storage.clickhouse import connect
from tests.analytics.scenario_data import play
from tests.analytics.test_explain_shedding import END, T0, held_rows
from tests.dashboard.apptest import ROOT, chart_frames, on_store, run, window


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


def test_investigate_says_what_held_the_latency_when_the_gateway_shed(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    ch.insert_df("requests", pd.DataFrame(held_rows(3)).astype({"weight": "float32"}))  # a flat TTFT, 2 in 3 shed
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("investigate", **{"from": T0.isoformat(), "to": END.isoformat()}, metric="ttft", q="0.99")
    assert not at.exception, at.exception
    ex = explain(ch, T0, END, latency="ttft", q=0.99)
    assert ex.break_at is None and at.warning[0].value == ex.sentence and "the gateway shed 67%" in ex.sentence
    assert not at.info  # no advice to widen the range: the range holds the overload
    evidence = next(t.value for t in at.dataframe if "Signal" in t.value.columns)
    assert list(evidence["Signal"]) == ["gateway shedding"]


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
