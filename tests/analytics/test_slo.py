"""SLOs on a long-context rollout of the simulated fleet: attainment from the engines' histograms
agrees with the request log's exact count, burn rates are the bad share over the budget and
page when both windows burn, goodput counts only requests that met every target of their model."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from analytics.slo import burn_rates, cost_per_slo_tokens, error_budget, goodput, slo_attainment
from storage.catalog import SloTarget
from tests.analytics.scenario_data import PRICES, play

TARGETS = [
    SloTarget("tiny-small", "ttft", 1.0, objective=0.99),
    SloTarget("tiny-small", "tpot", 0.1, objective=0.95),
    SloTarget("tiny-large", "ttft", 1.0, objective=0.99),
]


@pytest.fixture(scope="module")
def run(chdb_dir):  # noqa: ANN001
    return play(chdb_dir, "long-context-rollout", seed=4)


def exact(run, start, end) -> pd.DataFrame:  # noqa: ANN001
    """Per model: weighted share of gateway rows with TTFT <= 1 s and TPOT <= 0.1 s (computed here)."""
    df = run.client.query_df(
        "SELECT model, ttft_seconds, tpot_seconds, weight, outcome FROM requests WHERE source = 'gateway' "
        "AND ts >= {s:DateTime64(3)} AND ts < {e:DateTime64(3)}", parameters={"s": start, "e": end})
    df["ttft_ok"] = df["ttft_seconds"] <= 1.0
    return df


def test_attainment_from_histograms_matches_the_request_log(run) -> None:  # noqa: ANN001
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


def test_burn_rates_are_bad_share_over_budget_in_both_windows(run) -> None:  # noqa: ANN001
    at = run.phase("rollout") + timedelta(minutes=5)  # five minutes into the incident
    df = burn_rates(run.client, TARGETS, at)
    small = df[(df["model"] == "tiny-small") & (df["metric"] == "ttft")].set_index("short_window")
    bad_5m = 1 - slo_attainment(run.client, TARGETS[:1], at - timedelta(minutes=5), at)["attainment"].iloc[0]
    assert small.loc[timedelta(minutes=5), "burn_short"] == pytest.approx(bad_5m / 0.01)
    assert small.loc[timedelta(minutes=5), "burn_short"] > 14.4 and small.loc[timedelta(minutes=5), "firing"]
    assert small.loc[timedelta(minutes=5), "severity"] == "page"
    large = df[(df["model"] == "tiny-large") & (df["metric"] == "ttft")]
    assert not large["firing"].any()
    calm = burn_rates(run.client, TARGETS, run.phase("rollout"))  # before the incident: nothing burns fast
    assert not calm[calm["severity"] == "page"]["firing"].any()


def test_error_budget_is_spent_by_the_incident(run) -> None:  # noqa: ANN001
    budget = error_budget(run.client, TARGETS, run.end + timedelta(minutes=1)).set_index(["model", "metric"])
    small = budget.loc[("tiny-small", "ttft")]
    assert small["budget"] == pytest.approx(0.01)
    assert small["remaining"] == pytest.approx(1 - (1 - small["attainment"]) / 0.01)
    assert small["remaining"] < 0  # overspent: far more than 1 % of the month's requests were slow
    assert budget.loc[("tiny-large", "ttft"), "remaining"] > 0


def test_goodput_counts_requests_meeting_every_target(run) -> None:  # noqa: ANN001
    df = goodput(run.client, TARGETS, run.start, run.end).set_index("model")
    rows = exact(run, run.start, run.end)
    small = rows[rows["model"] == "tiny-small"]
    good = small[(small["ttft_seconds"] <= 1.0) & (small["tpot_seconds"] <= 0.1) & (small["outcome"] == "ok")]
    assert df.loc["tiny-small", "good"] == pytest.approx(good["weight"].sum())
    seconds = (run.end - run.start).total_seconds()
    assert df.loc["tiny-small", "goodput_per_s"] == pytest.approx(good["weight"].sum() / seconds)
    assert df.loc["tiny-small", "gpus"] == pytest.approx(2.0)  # two 1-GPU replicas, up all along
    assert df.loc["tiny-small", "goodput_per_gpu_s"] == pytest.approx(df.loc["tiny-small", "goodput_per_s"] / 2)
    assert df.loc["tiny-small", "attainment"] < df.loc["tiny-large", "attainment"]


def test_slo_compliant_tokens_cost_more_when_requests_miss(run) -> None:  # noqa: ANN001
    df = cost_per_slo_tokens(run.client, TARGETS, run.start, run.end, PRICES).set_index("model")
    small = df.loc["tiny-small"]
    assert small["cost_per_million_slo_tokens"] > small["cost_per_million_tokens"]
    assert small["cost_per_million_slo_tokens"] == pytest.approx(small["spend"] / small["good_tokens"] * 1e6)
    assert df.loc["(fleet)", "spend"] == pytest.approx(df.loc[["tiny-small", "tiny-large"], "spend"].sum())
