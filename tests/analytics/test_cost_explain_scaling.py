"""Explain names the autoscaler: replicas added are the "spend" part of a cost change (its detail,
and the sentence for every pool the view pays for, even under the 5 % cut), in the JSON document
too; a late scale-out is latency evidence (the share of the regression spent waiting for a decided
replica, its cold start in words). On played scenarios (simulated fleet, stored as the collector
stores it) with the autoscaler's decisions written to ``scale_events`` by its own event type."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from analytics.explain import explain, explain_cost
from analytics.filters import Filters
from tests.analytics.scale_rows import scale_out
from tests.analytics.scenario_data import PRICES, play

SAID = "tiny-large scaled out 1 -> 2 replicas (+1) at {:%H:%M} (kv_cache_usage 0.86 > 0.8)"


@pytest.fixture(scope="module")
def shift(chdb_dir):
    """router-shift: acme's prompts pass the router's long-prompt rule at +12 min and its requests move to
    tiny-large; the autoscaler answers 30 s later (tiny-large 1 -> 2, large-1 healthy +40 s, serving +42 s)."""
    played = play(chdb_dir, "router-shift", seed=1)
    decided = played.phase("acme-long-prompts") + timedelta(seconds=30)
    scale_out(played.client, "tiny-large", decided, "large-1")
    return played, decided


def test_the_scale_out_is_named_for_the_tenant_that_pays_for_it_and_not_for_one_that_does_not(shift) -> None:
    played, decided = shift
    at = played.phase("acme-long-prompts")
    acme = explain_cost(played.client, played.start, played.end, PRICES, filters=Filters(tenant="acme"), at=at)
    assert acme.decomposition["usd_per_million"].sum() == pytest.approx(acme.after - acme.before, rel=1e-9, abs=1e-9)
    # acme pays for tiny-large after its move: the replica added is named, whatever its part's rank
    for words in ("tenant acme", "long prompt (", SAID.format(decided)):
        assert words in acme.sentence, (words, acme.sentence)
    spend = acme.decomposition.set_index(["kind", "pool"]).loc[("spend", "tiny-large"), "detail"]
    assert (
        f"scaled out 1 -> 2 at {decided:%H:%M:%S} (kv_cache_usage 0.86 > 0.8), large-1 ready +40 s, serving +42 s"
        in (spend)
    ), spend
    doc = json.loads(json.dumps(acme.to_dict()))  # the --format json document
    [row] = doc["scaling"]
    assert (row["pool"], row["kind"], row["from_replicas"], row["to_replicas"], row["replica"]) == (
        "tiny-large", "scale_out", 1, 2, "large-1",
    )  # fmt: skip
    assert row["decided_at"].endswith("Z") and row["serving_at"] > row["ready_at"] > row["decided_at"]
    # globex stays in tiny-small: it pays nothing of tiny-large, whose scale-out is not its story
    globex = explain_cost(played.client, played.start, played.end, PRICES, filters=Filters(tenant="globex"), at=at)
    assert "scaled out" not in globex.sentence, globex.sentence


def test_the_fleet_explanation_names_the_scale_out_and_its_parts_add_up(shift) -> None:
    played, decided = shift
    at = played.phase("acme-long-prompts")
    fleet = explain_cost(played.client, played.start, played.end, PRICES, at=at)
    assert fleet.decomposition["usd_per_million"].sum() == pytest.approx(fleet.after - fleet.before, rel=1e-9, abs=1e-9)
    assert SAID.format(decided) in fleet.sentence and "tenant acme" in fleet.sentence, fleet.sentence
    # a window that ends before the decision has nothing to name
    early = explain_cost(
        played.client, played.start, decided - timedelta(minutes=1), PRICES, at=at - timedelta(minutes=4)
    )
    assert early.scaling.empty and "scaled out" not in early.sentence


@pytest.fixture(scope="module")
def onboarding(chdb_dir):
    return play(chdb_dir, "tenant-shift", seed=1)  # bigcorp's long prompts from +3 min: p99 TTFT rises


def test_a_latency_explanation_names_a_late_scale_out_with_its_cold_start(onboarding) -> None:
    run = onboarding
    before = explain(run.client, run.start, run.end)
    assert before.break_at is not None and "late scale-out" not in set(before.evidence["signal"])
    decided = before.break_at + timedelta(seconds=20)
    scale_out(
        run.client, "tiny-small", decided, "small-2", sizes=(2, 3), signal=("requests_waiting", 3.1, 2.0),
        crossed_s=25, ready_s=80, serving_s=90,
    )  # fmt: skip
    ex = explain(run.client, run.start, run.end)
    assert ex.break_at == before.break_at and ex.periods is not None
    late = ex.evidence.set_index("signal").loc["late scale-out"]
    regression = (ex.periods[2] - ex.periods[1]).total_seconds()
    assert late["score"] == pytest.approx(90 / regression, abs=1e-4)  # decided .. first token, inside the regression
    assert late["after"] == f"scale-out decided {decided:%H:%M:%S}, serving +90s"
    assert "small-2 ready" in late["detail"] and "(90 s cold start)" in late["detail"]
    assert "requests_waiting 3.1 > 2 since" in late["detail"]
    assert "a late scale-out (scale-out decided" in ex.sentence, ex.sentence
    # the model filter picks the pool: tiny-large's explanation has no tiny-small scale-out to wait for
    large = explain(run.client, run.start, run.end, filters=Filters(model="tiny-large"))
    assert "late scale-out" not in set(large.evidence["signal"])


@pytest.fixture(scope="module")
def defeat(chdb_dir):
    """router-defeat: acme's prompts pass the long-prompt rule at +12 min and the large pool autoscales
    (fleet-autoscale.yaml: tiny-large 1 -> 2 within about a minute, 40 s cold start)."""
    return play(chdb_dir, "router-defeat", seed=1, spec="fleet-autoscale.yaml")


def test_router_defeat_explained_for_the_tenant_and_the_fleet_names_the_replicas_added(defeat) -> None:
    switch, back = defeat.phase("acme-long-prompts"), defeat.phase("acme-back")
    acme = explain_cost(defeat.client, defeat.start, defeat.end, PRICES, filters=Filters(tenant="acme"))
    assert acme.break_at is not None and switch <= acme.break_at <= switch + timedelta(minutes=3), acme.sentence
    # the fleet's cost per token rises less than a break needs (its tokens grew with its spend): the
    # break in its spend per hour is the one explained, found without being told where
    fleet = explain_cost(defeat.client, defeat.start, back, PRICES)
    assert fleet.break_at is not None and switch <= fleet.break_at <= switch + timedelta(minutes=3), fleet.sentence
    bill = re.match(
        r"The spend per hour of the fleet rose from \$[\d.]+ to \$[\d.]+ at [\d:]+ UTC \(\+(\d+)%\)", fleet.sentence
    )
    assert bill is not None and int(bill.group(1)) >= 50, fleet.sentence
    for ex in (acme, fleet):
        assert ex.decomposition["usd_per_million"].sum() == pytest.approx(ex.after - ex.before, rel=1e-9, abs=1e-9)
        for words in ("tenant acme", "long prompt ("):
            assert words in ex.sentence, (words, ex.sentence)
        assert re.search(r"tiny-large scaled out 1 -> [23] replicas \(\+[12]\) at ", ex.sentence), ex.sentence
        spend = ex.decomposition.set_index(["kind", "pool"]).loc[("spend", "tiny-large")]
        assert spend["usd_per_million"] > 0 and "scaled out 1 -> 2 at" in spend["detail"], spend["detail"]
        outs = ex.scaling[ex.scaling["kind"] == "scale_out"].sort_values("decided_at")
        assert set(outs["pool"]) == {"tiny-large"} and len(outs) >= 1
        assert switch <= outs["decided_at"].iloc[0] <= switch + timedelta(minutes=3)
        assert (outs["ready_at"] - outs["decided_at"] == timedelta(seconds=40)).all()  # the simulated cold start
    # acme's rise is mostly the replica added: the spend part leads its evidence
    assert (acme.evidence.iloc[0]["kind"], acme.evidence.iloc[0]["pool"]) == ("spend", "tiny-large")
