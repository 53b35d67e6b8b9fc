"""Cost explained: the shift-share decomposition on hand-computed cases (its parts add up to after -
before), and ``explain_cost`` on the shipped ``router-shift`` scenario (simulated fleet, stored as
the collector stores it): the break, the pool that lost volume, the tenant whose requests moved,
and the router's reason."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from analytics.cost_explain import explain_cost, shift_share, view_cost
from analytics.cost_series import cost_over_time
from analytics.filters import Filters
from tests.analytics.scenario_data import PRICES, play


def side(**pools: tuple[float, float, float]) -> pd.DataFrame:
    """pool=(spend, pool tokens, the view's tokens)"""
    return pd.DataFrame.from_dict(pools, orient="index", columns=["spend", "pool_tokens", "view_tokens"])


def parts(before: pd.DataFrame, after: pd.DataFrame, fleet: bool = False) -> dict[tuple[str, str], float]:
    df = shift_share(before, after, idle_pools=fleet)
    change = view_cost(after, idle_pools=fleet) - view_cost(before, idle_pools=fleet)
    assert df["usd_per_token"].sum() == pytest.approx(change, rel=1e-12, abs=1e-15)  # exact, whatever the case
    return {(k, p): v for k, p, v in zip(df["kind"], df["pool"], df["usd_per_token"], strict=True) if abs(v) > 1e-15}


def test_a_pure_mix_change_is_all_mix() -> None:
    # pools keep their cost per token (small 1, large 3 per token); the view moves half its tokens to large
    before = side(small=(100, 100, 10), large=(300, 100, 0))
    after = side(small=(100, 100, 5), large=(300, 100, 5))
    got = parts(before, after)
    assert set(got) == {("mix", "small"), ("mix", "large")}
    assert got[("mix", "small")] == pytest.approx(-0.5 * 1) and got[("mix", "large")] == pytest.approx(0.5 * 3)
    assert view_cost(after) - view_cost(before) == pytest.approx(1.0)  # 1 -> 2 per token


def test_a_pool_that_loses_volume_is_all_volume() -> None:
    # the view stays in small; small keeps its spend and serves half the tokens: 1 -> 2 per token
    before = side(small=(100, 100, 20), large=(300, 100, 0))
    after = side(small=(100, 50, 20), large=(300, 150, 0))
    got = parts(before, after)
    assert set(got) == {("volume", "small")} and got[("volume", "small")] == pytest.approx(1.0)


def test_a_pool_that_costs_more_for_the_same_tokens_is_all_spend() -> None:
    before = side(small=(100, 100, 20))
    after = side(small=(150, 100, 20))  # a replica added
    got = parts(before, after)
    assert set(got) == {("spend", "small")} and got[("spend", "small")] == pytest.approx(0.5)


def test_mix_and_rate_together_add_up() -> None:
    before = side(small=(100, 100, 40), large=(300, 50, 10))
    after = side(small=(120, 60, 10), large=(280, 140, 40))
    got = parts(before, after)  # parts() checks the sum; here every kind takes part
    assert {k for k, _p in got} == {"mix", "volume", "spend"}


def test_a_pool_that_appears_or_empties_is_a_move_at_its_cost_on_the_other_side() -> None:
    appears = parts(side(small=(100, 100, 10)), side(small=(100, 100, 5), large=(300, 100, 5)))
    assert appears == {("mix", "small"): pytest.approx(-0.5), ("mix", "large"): pytest.approx(1.5)}
    empties = parts(side(small=(100, 100, 5), large=(300, 100, 5)), side(small=(100, 100, 10)))
    assert empties == {("mix", "small"): pytest.approx(0.5), ("mix", "large"): pytest.approx(-1.5)}


def test_the_fleet_carries_the_spend_of_pools_that_served_nothing() -> None:
    before = side(small=(100, 100, 100), large=(300, 100, 100))
    after = side(small=(100, 100, 100), large=(300, 0, 0))  # large still up, serving nobody
    got = parts(before, after, fleet=True)
    assert view_cost(after, idle_pools=True) == pytest.approx(4.0)  # 400 over the 100 tokens served
    assert ("idle pools", "") in got


def test_no_tokens_on_a_side_is_said_not_divided() -> None:
    with pytest.raises(ValueError, match="no tokens served before the break"):
        shift_share(side(small=(100, 100, 0)), side(small=(100, 100, 10)))


@pytest.fixture(scope="module")
def shift(chdb_dir):
    return play(chdb_dir, "router-shift", seed=1)  # acme's prompts pass the router's rule at +12 min


def test_a_tenant_whose_cost_rose_is_explained_by_the_pool_that_lost_volume(shift) -> None:
    switch = shift.phase("acme-long-prompts")
    ex = explain_cost(shift.client, shift.start, shift.end, PRICES, filters=Filters(tenant="globex"))
    assert ex.break_at is not None and abs((ex.break_at - switch).total_seconds()) <= 2 * ex.step
    assert ex.after > 1.3 * ex.before  # globex's own traffic did not change; its cost per 1M did
    assert ex.decomposition["usd_per_million"].sum() == pytest.approx(ex.after - ex.before, rel=1e-9)
    top = ex.evidence.iloc[0]
    assert (top["kind"], top["pool"]) == ("volume", "tiny-small") and top["share"] >= 0.8
    mover = ex.movers.iloc[0]
    assert (mover["tenant"], mover["to_pool"]) == ("acme", "tiny-large") and mover["reason"] == "long prompt"
    for words in ("tiny-small", "acme", "long prompt (", "tenant globex"):
        assert words in ex.sentence, (words, ex.sentence)
    doc = ex.to_dict()
    assert doc["break_at"].endswith("Z") and doc["change_usd_per_million"] == pytest.approx(ex.after - ex.before)
    assert {"kind", "pool", "usd_per_million", "share", "detail"} <= set(doc["decomposition"][0])


def test_the_cost_series_adds_up_to_the_window_and_shows_the_jump(shift) -> None:
    switch = shift.phase("acme-long-prompts")
    fleet = cost_over_time(shift.client, shift.start, shift.end, PRICES)
    tenants = cost_over_time(shift.client, shift.start, shift.end, PRICES, by="tenant")
    # 3 replicas (1 + 1 + 2 GPUs at $0.10) for the scenario's length, step by step
    hours = (shift.end - shift.start).total_seconds() / 3600
    assert fleet["spend"].sum() == pytest.approx(4 * 0.10 * hours, rel=0.01)
    assert (fleet["tokens"] >= 0).all() and (fleet["spend"] >= 0).all()
    globex = tenants[tenants["tenant"] == "globex"].set_index("ts")["cost_per_million_tokens"]
    before = globex[globex.index < pd.Timestamp(switch)].median()
    after = globex[
        (globex.index >= pd.Timestamp(switch) + timedelta(minutes=1))
        & (globex.index < pd.Timestamp(shift.phase("acme-back")))
    ].median()
    assert after > 1.4 * before


def test_a_view_without_prices_or_tokens_says_so(shift) -> None:
    with pytest.raises(KeyError, match="no GPU price for 'cpu-demo'"):
        cost_over_time(shift.client, shift.start, shift.end, {})
    quiet = explain_cost(
        shift.client, shift.start, shift.start + timedelta(minutes=2), PRICES, filters=Filters(tenant="nobody")
    )
    assert quiet.break_at is None and quiet.sentence.startswith("not enough steps with tokens for tenant nobody")
    with pytest.raises(ValueError, match="one view"):
        explain_cost(shift.client, shift.start, shift.end, PRICES, filters=Filters(tenant=["acme", "globex"]))
