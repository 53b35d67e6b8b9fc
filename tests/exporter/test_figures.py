"""Each family the exporter serves equals the analytics figure it comes from, on the same data
and window: the exporter's refresh (pinned to a time in the seeded run) rendered as a scrape
reads it, beside analytics' own functions called the way the Cost, Capacity and Latency pages
and the alert readers call them."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from analytics.allocation import FLEET
from analytics.cost import cost_by_adapter, cost_by_tenant, cost_per_token
from analytics.prefix import CLASSES, prefix_misses
from analytics.saturation import Targets, headroom
from analytics.slo import burn_rates, window_coverage
from analytics.specdecode import acceptance
from analytics.stalls import replica_models, stalls
from exporter.families import FAMILIES
from exporter.read import Params, Stores
from exporter.refresh import Refresher
from storage.catalog import gpu_prices
from tests.exporter.conftest import TARGETS, stall_at
from tests.exporter.exposition import key, of, samples, text

PARAMS = Params()  # the defaults: cost, headroom, prefix over 1 h; stalls, drafts over 10 min


def scrape(run, sessions, at) -> dict:
    refresher = Refresher(lambda: Stores(run.client, sessions), PARAMS, clock=lambda: at)
    failed = refresher.refresh()
    assert not failed, failed
    return samples(text(refresher))


@pytest.fixture(scope="module")
def stalled(stall, sessions):
    at = stall_at(stall)
    return stall, sessions, at, scrape(stall, sessions, at)


def hours(df) -> float:
    plan = df.attrs["plan"]
    return (plan.end - plan.start).total_seconds() / 3600


def test_cost_per_million_tokens_and_spend_per_hour_by_model_are_analytics_cost_per_token(stalled) -> None:
    run, sessions, at, found = stalled
    want = cost_per_token(run.client, at - timedelta(hours=1), at, gpu_prices(sessions), now=at)
    per_model = want[want["model"] != FLEET]
    assert set(per_model["model"]) == {"tiny-small", "tiny-large"}
    for row in per_model.to_dict("records"):
        model = key(model=row["model"])
        assert of(found, "fleetscope_model_cost_usd_per_million_tokens")[model] == row["cost_per_million_tokens"]
        assert of(found, "fleetscope_model_spend_usd_per_hour")[model] == row["spend"] / hours(want)
        assert of(found, "fleetscope_model_idle_spend_usd_per_hour")[model] == row["idle_spend"] / hours(want)
    fleet = want[want["model"] == FLEET].iloc[0]
    assert of(found, "fleetscope_fleet_cost_usd_per_million_tokens") == {key(): fleet["cost_per_million_tokens"]}


def test_tenants_are_analytics_showback_and_add_up_to_the_fleets_spend(stalled) -> None:
    run, sessions, at, found = stalled
    want = cost_by_tenant(run.client, at - timedelta(hours=1), at, gpu_prices(sessions), now=at)
    assert {"acme", "globex", "initech"} <= set(want["tenant"])
    spend = of(found, "fleetscope_tenant_spend_usd_per_hour")
    for row in want.to_dict("records"):
        assert spend[key(tenant=row["tenant"])] == pytest.approx(row["spend"] / hours(want), rel=1e-12)
        if not math.isnan(row["cost_per_million_tokens"]):  # it has tokens
            got = of(found, "fleetscope_tenant_cost_usd_per_million_tokens")[key(tenant=row["tenant"])]
            assert got == pytest.approx(row["cost_per_million_tokens"], rel=1e-12)
    pools = sum(of(found, "fleetscope_model_spend_usd_per_hour").values())
    assert sum(spend.values()) == pytest.approx(pools, rel=1e-9)  # "(unattributed)" holds the rest


def test_adapters_are_analytics_cost_by_adapter_with_their_base_model(adapters, sessions) -> None:
    at = adapters.end
    found = scrape(adapters, sessions, at)
    want = cost_by_adapter(adapters.client, at - timedelta(hours=1), at, gpu_prices(sessions), now=at)
    assert set(want["adapter"]) == {"support-bot", "legal-bot", "code-bot", "sql-bot"}
    got = of(found, "fleetscope_adapter_cost_usd_per_million_tokens")
    spend = of(found, "fleetscope_adapter_spend_usd_per_hour")
    for row in want.to_dict("records"):
        labels = key(adapter=row["adapter"], model=row["base"])
        assert row["base"] == "tiny-small"
        assert got[labels] == pytest.approx(row["cost_per_million_tokens"], rel=1e-12)
        assert spend[labels] == pytest.approx(row["spend"] / hours(want), rel=1e-12)


def test_burn_rates_are_analytics_burn_rates_over_each_window(stalled) -> None:
    run, _sessions, at, found = stalled
    want = burn_rates(run.client, list(TARGETS), at, now=at)
    got = of(found, "fleetscope_slo_burn_rate")
    labels = {
        timedelta(minutes=5): "5m",
        timedelta(minutes=30): "30m",
        timedelta(hours=1): "1h",
        timedelta(hours=6): "6h",
        timedelta(days=3): "3d",
    }
    checked = 0
    for row in want.to_dict("records"):
        for span, burn in ((row["long_window"], row["burn_long"]), (row["short_window"], row["burn_short"])):
            names = key(model=row["model"], metric=row["metric"], slo=row["label"], window=labels[span])
            if math.isnan(burn):  # no requests of the model in the window: no sample
                assert names not in got
                continue
            assert got[names] == burn
            checked += 1
    assert checked >= 10  # the tiny-small and tiny-large targets have requests in every window
    coverage = of(found, "fleetscope_slo_window_coverage_ratio")
    assert set(coverage) == {key(window=w) for w in ("5m", "30m", "1h", "6h", "3d")}
    assert coverage[key(window="5m")] == window_coverage(run.client, at - timedelta(minutes=5), at) == 1.0
    assert coverage[key(window="3d")] == window_coverage(run.client, at - timedelta(days=3), at) < 0.01
    target = TARGETS[2]
    slo = key(model=target.model, metric=target.metric, slo=target.label)
    assert of(found, "fleetscope_slo_objective_ratio")[slo] == 0.95
    assert of(found, "fleetscope_slo_threshold_seconds")[slo] == 30.0


def test_headroom_is_analytics_headroom_per_pool(stalled) -> None:
    run, _sessions, at, found = stalled
    want = headroom(run.client, at - timedelta(hours=1), at, now=at)
    assert set(want["model"]) == {"tiny-small", "tiny-large"}
    for row in want.to_dict("records"):
        pool = key(model=row["model"])
        assert of(found, "fleetscope_pool_headroom_ratio")[pool] == row["headroom"]
        assert of(found, "fleetscope_pool_kv_cache_usage_ratio")[pool] == row["kv_recent"]
        assert of(found, "fleetscope_pool_waiting_requests_per_replica")[pool] == row["waiting_per_replica"]
        assert of(found, "fleetscope_pool_replicas")[pool] == row["replicas"]
        assert of(found, "fleetscope_pool_saturated_replicas")[pool] == len(row["saturated"])


def test_prefix_miss_classes_are_analytics_prefix_misses(stalled) -> None:
    run, _sessions, at, found = stalled
    want = prefix_misses(run.client, at - timedelta(hours=1), at, "model")
    got = of(found, "fleetscope_prefix_cache_prompt_tokens_ratio")
    for model, part in want.groupby("model"):
        tokens = {c: float(part[c].sum()) for c in CLASSES}
        total = sum(tokens.values())
        shares = {c: got[key(model=str(model), **{"class": c})] for c in CLASSES}
        assert shares == pytest.approx({c: tokens[c] / total for c in CLASSES}, rel=1e-12)
        assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["hit"] > 0 and shares["evicted"] + shares["routing"] + shares["new_prefix"] > 0
    hits = of(found, "fleetscope_prefix_cache_hit_ratio")
    assert hits[key(source="modelled")] == want.attrs["hit_rate"]
    assert hits[key(source="engines")] == want.attrs["observed_hit_rate"]
    assert hits[key(source="affinity_routing")] == want.attrs["affinity_hit_rate"]


def test_an_ongoing_stall_is_analytics_stalls(stalled) -> None:
    run, _sessions, at, found = stalled
    want = stalls(run.client, at - timedelta(minutes=10), at, now=at)
    ongoing = want[want["ongoing"]]
    assert list(ongoing["replica"]) == ["small-1"]
    seconds = float(ongoing["seconds"].iloc[0])
    assert seconds >= Targets().stall_s
    held = of(found, "fleetscope_replica_stall_duration_seconds")
    assert held == {
        key(replica="small-0", model="tiny-small"): 0.0,
        key(replica="small-1", model="tiny-small"): seconds,
        key(replica="large-0", model="tiny-large"): 0.0,
    }
    assert of(found, "fleetscope_replica_stalled") == {labels: float(s > 0) for labels, s in held.items()}


def test_stalls_clear_once_the_engine_goes_on(stall, sessions) -> None:
    at = stall.start + timedelta(minutes=11)  # small-1 resumed at minute 9
    found = scrape(stall, sessions, at)
    assert stalls(stall.client, at - timedelta(minutes=10), at, now=at)["ongoing"].sum() == 0
    assert set(of(found, "fleetscope_replica_stalled").values()) == {0.0}


def test_draft_acceptance_is_analytics_acceptance_per_replica(drafts, sessions) -> None:
    at = drafts.end
    found = scrape(drafts, sessions, at)
    want = acceptance(drafts.client, at - timedelta(minutes=10), at, "replica", now=at)
    assert list(want["replica"]) == ["spec-0"]
    row = want.iloc[0]
    labels = key(replica="spec-0", model=replica_models(drafts.client)["spec-0"])
    assert of(found, "fleetscope_spec_decode_acceptance_ratio") == {labels: row["acceptance_rate"]}
    assert of(found, "fleetscope_spec_decode_tokens_per_step") == {labels: row["mean_accepted_length"]}
    assert row["acceptance_rate"] < 0.5  # the free-form prompts after minute 5: the drafts mostly missed


def test_every_family_has_samples_on_the_seeded_runs(stalled, drafts, adapters, sessions) -> None:
    """No family is dead weight: each has a sample on one of the seeded runs."""
    seen = {name for name, _labels in stalled[3]}
    seen |= {name for name, _labels in scrape(drafts, sessions, drafts.end)}
    seen |= {name for name, _labels in scrape(adapters, sessions, adapters.end)}
    assert {f.name for f in FAMILIES} - seen == set()
