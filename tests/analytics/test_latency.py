"""Latency over time, from both sources: each step's value is what the one-window functions
give for that step, counter rates add up to the window's increase across an engine restart,
and the vectorised bucket interpolation is Prometheus' on every kind of histogram."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest

from analytics.counters import increase as reference_increase
from analytics.filters import Filters
from analytics.latency import latency_over_time
from analytics.metrics import bucket_quantile, counter_increase, histogram_quantile
from analytics.requests import request_quantile
from analytics.timeseries import auto_step, bucket_quantiles, counter_rate_over_time
from tests.analytics.scenario_data import play

TTFT = "vllm:time_to_first_token_seconds"


@pytest.fixture(scope="module")
def run(chdb_dir):
    return play(chdb_dir, "replica-crash", seed=2)


def test_vectorised_quantiles_are_prometheus_quantiles() -> None:
    rng = np.random.default_rng(0)
    inf = math.inf
    cases = [
        (np.array([0.1, 0.5, 1.0, inf]), np.array([[0, 0, 0, 0], [5, 5, 5, 5], [0, 0, 0, 7], [1, 4, 9, 10]])),
        (np.array([inf]), np.array([[3]])),  # +Inf only: NaN
        (np.array([2.0, inf]), np.array([[0, 4], [4, 4]])),
        (np.array([0.0, 1.0, inf]), np.array([[0, 5, 5], [2, 5, 5]])),  # a first bound <= 0 is the answer
        (np.array([-1.0, 0.5, inf]), np.array([[0, 3, 4], [1, 1, 1]])),
    ]
    for _ in range(50):
        bounds = np.r_[np.sort(rng.choice(np.arange(1, 100), size=rng.integers(1, 8), replace=False)) / 10, inf]
        counts = np.cumsum(rng.integers(0, 5, size=(6, len(bounds))), axis=1)
        cases.append((bounds, counts))
    for bounds, counts in cases:
        for q in (0.0, 0.25, 0.5, 0.9, 0.99, 1.0):
            got = bucket_quantiles(q, bounds, counts)
            want = [bucket_quantile(q, bounds, row) for row in counts]
            assert np.allclose(got, want, equal_nan=True), (q, bounds, counts, got, want)


def test_auto_step_is_a_nice_width_and_whole_rollup_buckets() -> None:
    from datetime import UTC, datetime

    t = datetime(2026, 1, 1, tzinfo=UTC)
    assert auto_step(t, t + timedelta(minutes=15)) == 10
    assert auto_step(t, t + timedelta(hours=6)) == 300
    assert auto_step(t, t + timedelta(days=7)) == 7200


def test_each_step_matches_the_one_window_functions(run) -> None:
    start = run.start.replace(second=0) + timedelta(minutes=1)
    end = start + timedelta(minutes=3)
    df = latency_over_time(run.client, "ttft", start, end, levels=(0.5, 0.99), step=60, tier="raw")
    assert set(df["source"]) == {"engine histograms", "request log"}
    for _source, frame in df.groupby("source"):
        assert len(frame) == 3 * 2 * 2  # steps x models x levels
    for row in df[df["q"] == 0.99].itertuples():
        a, b = row.ts.to_pydatetime(), row.ts.to_pydatetime() + timedelta(seconds=60)
        if row.source == "engine histograms":
            one = histogram_quantile(run.client, TTFT, 0.99, a, b, "model", tier="raw").set_index("model")
        else:
            one = (
                request_quantile(run.client, "ttft", 0.99, a, b, tier="raw")
                .set_index("model")
                .rename(columns={"value": "quantile"})
            )
        assert row.value == pytest.approx(one.loc[row.model, "quantile"], rel=1e-6), row


def test_filters_reach_the_request_log_and_are_reported_for_histograms(run) -> None:
    acme = latency_over_time(run.client, "ttft", run.start, run.end, filters=Filters(tenant="acme"), levels=(0.5,))
    assert acme.attrs["unapplied"] == {"engine histograms": ["tenant"], "request log": []}
    everyone = latency_over_time(run.client, "ttft", run.start, run.end, levels=(0.5,), sources=("request log",))
    share = acme[acme["source"] == "request log"]["count"].sum() / everyone["count"].sum()
    assert share == pytest.approx(0.5, abs=0.06)  # acme sends half the scenario's traffic
    with pytest.raises(ValueError, match="unknown latency"):
        latency_over_time(run.client, "ttfb", run.start, run.end)


def test_an_unaligned_window_is_widened_to_whole_steps(run) -> None:
    start = run.start.replace(second=0) + timedelta(minutes=2, seconds=30)  # not on a minute
    end = start + timedelta(minutes=4)
    steps = counter_rate_over_time(run.client, "vllm:prompt_tokens_total", start, end, "replica", step=60, tier="raw")
    p = steps.attrs["plan"]
    assert (p.start, p.end) == (start - timedelta(seconds=30), end + timedelta(seconds=30))
    whole = counter_increase(run.client, "vllm:prompt_tokens_total", p.start, p.end, "replica", tier="raw")
    assert steps.groupby("replica")["increase"].sum().to_dict() == pytest.approx(
        whole.set_index("replica")["increase"].to_dict()
    )
    both = latency_over_time(run.client, "ttft", start, end, levels=(0.99,), step=60, tier="raw")
    grids = [set(frame["ts"]) for _source, frame in both.groupby("source")]
    assert grids[0] == grids[1] and len(grids[0]) == 5  # the same five whole minutes from both sources


def test_counter_rates_add_up_across_the_restart(run) -> None:
    start, end = run.start.replace(second=0), run.end.replace(second=0)
    steps = counter_rate_over_time(run.client, "vllm:prompt_tokens_total", start, end, "replica", step=60, tier="raw")
    total = counter_increase(run.client, "vllm:prompt_tokens_total", start, end, "replica", tier="raw").set_index(
        "replica"
    )
    values = reference_increase(run.client, "vllm:prompt_tokens_total", start, end, "replica").set_index("replica")
    for replica, frame in steps.groupby("replica"):
        assert frame["increase"].sum() == pytest.approx(total.loc[replica, "increase"])
        assert frame["increase"].sum() == pytest.approx(values.loc[replica, "increase"])
        assert (frame["increase"] >= 0).all()
    assert steps.set_index("replica").loc["small-1", "increase"].sum() > 0  # it restarted and served again


def test_one_query_for_many_metrics_answers_as_one_query_each(run) -> None:
    """What a page reads in one query (several counters, several gauges, a histogram with the
    fleet's line beside the models') is what it would read metric by metric."""
    from analytics.metrics import counter_increases, gauge_summaries, gauge_summary
    from analytics.timeseries import (
        counter_rates_over_time,
        gauge_over_time,
        gauges_over_time,
        histogram_quantiles_over_time,
    )

    start, end = run.start.replace(second=0), run.end.replace(second=0)
    counters = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"]
    gauges = ["vllm:kv_cache_usage_perc", "vllm:num_requests_running"]
    for tier in ("raw", "1m"):
        many = counter_increases(run.client, counters, start, end, "replica", tier=tier)
        for metric in counters:
            one = counter_increase(run.client, metric, start, end, "replica", tier=tier)
            got = many[many["metric"] == metric].set_index("replica")["increase"]
            assert got.to_dict() == pytest.approx(one.set_index("replica")["increase"].to_dict()) and len(one)
        many = gauge_summaries(run.client, gauges, start, end, "model", tier=tier)
        for metric in gauges:
            one = gauge_summary(run.client, metric, start, end, "model", tier=tier).set_index("model")
            got = many[many["metric"] == metric].drop(columns="metric").set_index("model")
            assert np.allclose(got.to_numpy(float), one.to_numpy(float), equal_nan=True) and len(one)
        rates = counter_rates_over_time(run.client, counters, start, end, "model", step=60, tier=tier)
        levels = gauges_over_time(run.client, gauges, start, end, "model", step=60, tier=tier)
        for metric in counters:
            one = counter_rate_over_time(run.client, metric, start, end, "model", step=60, tier=tier)
            got = rates[rates["metric"] == metric].drop(columns="metric").reset_index(drop=True)
            assert got[["increase", "rate"]].to_numpy() == pytest.approx(one[["increase", "rate"]].to_numpy())
        for metric in gauges:
            one = gauge_over_time(run.client, metric, start, end, "model", step=60, tier=tier)
            got = levels[levels["metric"] == metric].drop(columns="metric").reset_index(drop=True)
            assert list(got["ts"]) == list(one["ts"]) and got["avg"].to_numpy() == pytest.approx(one["avg"].to_numpy())
    with_fleet = histogram_quantiles_over_time(run.client, TTFT, (0.5, 0.99), start, end, "model", step=60, total=True)
    fleet = histogram_quantiles_over_time(run.client, TTFT, (0.5, 0.99), start, end, "fleet", step=60)
    got = with_fleet[with_fleet["model"] == "(fleet)"].reset_index(drop=True)
    assert len(got) == len(fleet) > 0 and list(got["ts"]) == list(fleet["ts"])
    assert np.allclose(
        got[["value", "count"]].to_numpy(float), fleet[["value", "count"]].to_numpy(float), equal_nan=True
    )
    models = with_fleet[with_fleet["model"] != "(fleet)"].reset_index(drop=True)
    alone = histogram_quantiles_over_time(run.client, TTFT, (0.5, 0.99), start, end, "model", step=60)
    assert np.allclose(
        models[["value", "count"]].to_numpy(float), alone[["value", "count"]].to_numpy(float), equal_nan=True
    )


def test_the_window_from_the_steps_is_the_one_window_quantile(run) -> None:
    from analytics.timeseries import histogram_steps_and_window

    start, end = run.start.replace(second=0) + timedelta(seconds=20), run.end.replace(second=0)  # not on a step
    for tier in ("raw", "1m"):
        steps, window = histogram_steps_and_window(
            run.client, TTFT, (0.5, 0.99), start, end, "model", step=120, tier=tier, total=True
        )
        p = window.attrs["plan"]
        assert (
            p.start <= start
            and p.end >= end
            and (p.start, p.end) == (steps.attrs["plan"].start, steps.attrs["plan"].end)
        )
        for q in (0.5, 0.99):
            got = window[window["q"] == q].set_index("model")
            for by in ("model", "fleet"):
                want = histogram_quantile(run.client, TTFT, q, p.start, p.end, by, tier=tier).set_index(by)
                assert len(want) and set(want.index) <= set(got.index)
                for key, row in want.iterrows():
                    assert got.loc[key, "value"] == pytest.approx(row["quantile"]) and got.loc[
                        key, "count"
                    ] == pytest.approx(row["count"])


def test_several_histograms_in_one_query_answer_as_each_alone(run) -> None:
    from analytics.timeseries import (
        histogram_heatmap_over_time,
        histogram_steps_and_window,
        histograms,
    )

    start, end = run.start.replace(second=0), run.end.replace(second=0)
    families = [TTFT, "vllm:inter_token_latency_seconds"]
    both = histograms(run.client, families, (0.5, 0.99), start, end, "model", step=60, total=True)
    for family in families:
        steps, window = histogram_steps_and_window(
            run.client, family, (0.5, 0.99), start, end, "model", step=60, total=True
        )
        got = both[family]
        assert len(steps) > 0 and list(got.steps["ts"]) == list(steps["ts"])
        assert np.allclose(
            got.steps[["value", "count"]].to_numpy(float), steps[["value", "count"]].to_numpy(float), equal_nan=True
        )
        assert np.allclose(
            got.window[["value", "count"]].to_numpy(float), window[["value", "count"]].to_numpy(float), equal_nan=True
        )
        # the heatmap: every observation of a step in exactly one bucket, over all the models
        heat = histogram_heatmap_over_time(run.client, family, start, end, step=60)
        per_step = heat.groupby("ts")["count"].sum()
        fleet = steps[(steps["model"] == "(fleet)") & (steps["q"] == 0.5)].set_index("ts")["count"]
        assert per_step.to_numpy() == pytest.approx(fleet.reindex(per_step.index).to_numpy())
        assert got.heatmap["count"].to_numpy() == pytest.approx(heat["count"].to_numpy())


def test_a_gauge_mean_times_its_series_is_its_sum(run) -> None:
    from analytics.timeseries import gauges_over_time

    start, end = run.start.replace(second=0), run.end.replace(second=0)
    gauges = ["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
    for by in ("fleet", "model"):
        mean = gauges_over_time(run.client, gauges, start, end, by, step=60)
        total = gauges_over_time(run.client, gauges, start, end, by, step=60, agg="sum")
        assert len(mean) > 0 and (mean["replicas"] >= 1).all() and (mean["series"] >= mean["replicas"]).all()
        assert (mean["avg"] * mean["series"]).to_numpy() == pytest.approx(total["avg"].to_numpy())
