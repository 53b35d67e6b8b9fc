"""SLOs on a long-context rollout of the simulated fleet: attainment from the engines' histograms
agrees with the request log's exact count, burn rates are the bad share over the budget and
page when both windows burn, goodput counts only requests that met every target of their model."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from analytics.filters import Filters
from analytics.slo import burn_rates, cost_per_slo_tokens, error_budget, goodput, slo_attainment
from storage.catalog import SloTarget
from tests.analytics.scenario_data import PRICES, play

TARGETS = [
    SloTarget("tiny-small", "ttft", 1.0, objective=0.99),
    SloTarget("tiny-small", "tpot", 0.1, objective=0.95),
    SloTarget("tiny-large", "ttft", 1.0, objective=0.99),
]


@pytest.fixture(scope="module")
def run(chdb_dir):
    return play(chdb_dir, "long-context-rollout", seed=4)


def exact(run, start, end) -> pd.DataFrame:
    """Per model: weighted share of gateway rows with TTFT <= 1 s and TPOT <= 0.1 s (computed here)."""
    df = run.client.query_df(
        "SELECT model, ttft_seconds, tpot_seconds, weight, outcome FROM requests WHERE source = 'gateway' "
        "AND ts >= {s:DateTime64(3)} AND ts < {e:DateTime64(3)}",
        parameters={"s": start, "e": end},
    )
    df["ttft_ok"] = df["ttft_seconds"] <= 1.0
    return df


def test_attainment_from_histograms_matches_the_request_log(run) -> None:
    end = run.end + timedelta(minutes=2)  # histograms count a request when it finishes
    got = slo_attainment(run.client, TARGETS, run.start, end).set_index(["model", "metric"])
    rows = exact(run, run.start, end)
    for model in ("tiny-small", "tiny-large"):
        share = rows.loc[rows["model"] == model, "ttft_ok"].mean()
        # 1 s is a bucket bound of vLLM's TTFT histogram: the count below it is exact
        assert got.loc[(model, "ttft"), "attainment"] == pytest.approx(share, abs=0.01)
        assert got.loc[(model, "ttft"), "requests"] == (rows["model"] == model).sum()
    small = got.loc[("tiny-small", "ttft")]
    assert not small["met"] and small["observed"] > 1.0  # the rollout broke the small model's TTFT objective
    assert got.loc[("tiny-large", "ttft"), "met"]


def bucket_counts(run, model: str, at) -> tuple[float, float]:
    """(TTFT observations <= 1 s, all) counted by the engines of ``model`` up to ``at``: the raw
    bucket samples read with plain SQL (the run has no engine restart)."""
    rows = run.client.query(
        "SELECT s.labels['le'] AS le, sum(v.last) FROM (SELECT fingerprint, argMax(value, ts) AS last FROM samples "
        "WHERE metric = 'vllm:time_to_first_token_seconds_bucket' AND ts < {at:DateTime64(3)} GROUP BY fingerprint) AS v "
        "INNER JOIN (SELECT fingerprint, any(labels) AS labels, any(model) AS model FROM series GROUP BY fingerprint) AS s "
        "ON s.fingerprint = v.fingerprint WHERE s.model = {m:String} AND le IN ('1.0', '+Inf') GROUP BY le",
        parameters={"at": at, "m": model},
    ).result_rows
    counts = dict(rows)
    return counts["1.0"], counts["+Inf"]


def test_burn_rates_are_bad_share_over_budget_in_both_windows(run) -> None:
    at = run.phase("rollout") + timedelta(minutes=5)  # five minutes into the incident
    df = burn_rates(run.client, TARGETS, at)
    small = df[(df["model"] == "tiny-small") & (df["metric"] == "ttft")].set_index("short_window")
    good_now, all_now = bucket_counts(run, "tiny-small", at)
    good_then, all_then = bucket_counts(run, "tiny-small", at - timedelta(minutes=5))
    bad_5m = 1 - (good_now - good_then) / (all_now - all_then)
    assert small.loc[timedelta(minutes=5), "burn_short"] == pytest.approx(bad_5m / 0.01)
    assert small.loc[timedelta(minutes=5), "burn_short"] > 14.4 and small.loc[timedelta(minutes=5), "firing"]
    assert small.loc[timedelta(minutes=5), "severity"] == "page"
    large = df[(df["model"] == "tiny-large") & (df["metric"] == "ttft")]
    assert not large["firing"].any()
    calm = burn_rates(run.client, TARGETS, run.phase("rollout"))  # before the incident: nothing burns fast
    assert not calm[calm["severity"] == "page"]["firing"].any()


def test_error_budget_is_spent_by_the_incident(run) -> None:
    at = run.end + timedelta(minutes=1)
    budget = error_budget(run.client, TARGETS, at).set_index(["model", "metric"])
    good, total = bucket_counts(run, "tiny-small", at)  # the 30-day window holds the whole run
    small = budget.loc[("tiny-small", "ttft")]
    assert small["budget"] == pytest.approx(0.01)
    assert small["remaining"] == pytest.approx(1 - (1 - good / total) / 0.01)
    assert small["remaining"] < 0  # overspent: far more than 1 % of the month's requests were slow
    assert budget.loc[("tiny-large", "ttft"), "remaining"] > 0


def test_percentile_targets_are_met_by_the_observed_percentile(run) -> None:
    window = (run.start, run.phase("rollout"))  # before the incident
    # "p50 TTFT <= 100 ms": about 80 % of these requests are that fast (100 ms is a bucket bound)
    targets = [
        SloTarget("tiny-small", "ttft", 0.1, objective=0.99, percentile=0.5),
        SloTarget("tiny-small", "e2e", 0.1, objective=0.99),
    ]
    got = slo_attainment(run.client, targets, *window).set_index("metric")
    rows = exact(run, *window)
    small = rows[rows["model"] == "tiny-small"]
    assert small["ttft_seconds"].median() < 0.1
    assert got.loc["ttft", "observed"] < 0.1 and got.loc["ttft", "met"]
    assert got.loc["ttft", "attainment"] == pytest.approx((small["ttft_seconds"] <= 0.1).mean(), abs=0.01)
    assert got.loc["ttft", "attainment"] < 0.99  # as a threshold target it would have failed
    assert not got.loc["e2e", "met"]


def test_goodput_counts_requests_meeting_every_target(run) -> None:
    df = goodput(run.client, TARGETS, run.start, run.end).set_index("model")
    rows = exact(run, run.start, run.end)
    small = rows[rows["model"] == "tiny-small"]
    good = small[(small["ttft_seconds"] <= 1.0) & (small["tpot_seconds"] <= 0.1) & (small["outcome"] == "ok")]
    assert df.loc["tiny-small", "good"] == pytest.approx(good["weight"].sum())
    seconds = (run.end - run.start).total_seconds()
    assert df.loc["tiny-small", "goodput_per_s"] == pytest.approx(good["weight"].sum() / seconds)
    # two 1-GPU replicas, up from their first scrape (5 s in) to the end
    gpus = 2.0 * (seconds - 5) / seconds
    assert df.loc["tiny-small", "gpus"] == pytest.approx(gpus, rel=1e-3)
    assert df.loc["tiny-small", "goodput_per_gpu_s"] == pytest.approx(good["weight"].sum() / seconds / gpus, rel=1e-3)
    assert df.loc["tiny-small", "attainment"] < df.loc["tiny-large", "attainment"]


def test_slo_compliant_tokens_cost_more_when_requests_miss(run) -> None:
    df = cost_per_slo_tokens(run.client, TARGETS, run.start, run.end, PRICES).set_index("model")
    small = df.loc["tiny-small"]
    # two 1-GPU replicas at $0.10 per GPU-hour for the 15-minute run, from their first scrape 5 s in
    spend = 2 * 0.10 * (900 - 5) / 3600
    assert small["spend"] == pytest.approx(spend, rel=1e-6)
    good = run.client.query(
        "SELECT sum(weight * (prompt_tokens + completion_tokens)) FROM requests WHERE source = 'gateway' "
        "AND model = 'tiny-small' AND ttft_seconds <= 1 AND tpot_seconds <= 0.1 AND outcome = 'ok'"
    ).result_rows[0][0]
    assert small["cost_per_million_slo_tokens"] == pytest.approx(spend / good * 1e6, rel=1e-6)
    assert small["cost_per_million_slo_tokens"] > small["cost_per_million_tokens"]
    acme = cost_per_slo_tokens(
        run.client, TARGETS, run.start, run.end, PRICES, filters=Filters(tenant="acme")
    ).set_index("model")
    assert acme.loc["tiny-small", "spend"] < 0.7 * small["spend"]  # acme's tokens' share of the pool, not all of it
