"""Cost explained: the Shapley decomposition on hand-computed cases (its parts add up to after -
before, depend on no order, and do not jump at an empty pool), and ``explain_cost`` on the shipped
``router-shift`` and ``adapter-thrash`` scenarios (simulated fleet, stored as the collector stores
it): the break, the part that moved the cost, the tenant whose requests moved and the router's
reason; the showback, the series and explain reading one number."""

from __future__ import annotations

import re
from datetime import timedelta

import pandas as pd
import pytest

from analytics.cost import TokenWeights
from analytics.cost_series import cost_over_time
from analytics.explain import explain_cost
from analytics.explain.cost_parts import Side, decompose, level, shapley
from analytics.filters import Filters
from tests.analytics.agreement import disagreements, figures
from tests.analytics.scenario_data import PRICES, play


def side(x: float, **pools: tuple[float, float, float, float]) -> Side:
    """pool=(spend S, the view's part of it D, the view's weighted tokens w, the others' o), per hour;
    x: the view's tokens per hour."""
    table = pd.DataFrame.from_dict(
        pools, orient="index", columns=["spend", "view_spend", "view_weighted", "other_weighted"]
    )
    return Side(table, x)


def payer(x: float, **pools: tuple[float, float, float]) -> Side:
    """A payer whose share of each pool is w / (w + o) (one bucket): pool=(S, w, o)."""
    return side(x, **{p: (s, s * w / (w + o) if w + o else 0.0, w, o) for p, (s, w, o) in pools.items()})


def whole(x: float, **spend: float) -> Side:
    """The fleet or one pool: all of each pool's spend is the view's."""
    return side(x, **{p: (s, s, 0.0, 0.0) for p, s in spend.items()})


def parts(before: Side, after: Side, shared: bool = True) -> dict[tuple[str, str], float]:
    df = decompose(before, after, shared=shared)
    change = level(after) - level(before)
    assert df["usd_per_token"].sum() == pytest.approx(change, rel=1e-12, abs=1e-15)  # exact, whatever the case
    found: dict[tuple[str, str], float] = {}
    for kind, pool, value in zip(df["kind"], df["pool"], df["usd_per_token"], strict=True):
        key = ("traffic", "") if kind == "traffic" else (kind, pool)  # the view's traffic is one part
        found[key] = found.get(key, 0.0) + value
    return {k: v for k, v in found.items() if abs(v) > 1e-12}


def test_shapley_values_of_a_product_split_the_interaction_evenly() -> None:
    # v = a x b with a: 1 -> 2, b: 1 -> 3: the change 5 = a alone 1, b alone 2, and their interaction 2,
    # half to each: a 1 + 1 = 2, b 2 + 1 = 3
    a, b = (1.0, 2.0), (1.0, 3.0)
    assert shapley(lambda c: a[c[0]] * b[c[1]], 2) == pytest.approx([2.0, 3.0])
    # three players: each one's value is the same in whatever order they are listed
    f = (1.0, 2.0), (3.0, 5.0), (2.0, 1.0)
    one = shapley(lambda c: f[0][c[0]] * f[1][c[1]] / f[2][c[2]], 3)
    other = shapley(lambda c: f[0][c[2]] * f[1][c[0]] / f[2][c[1]], 3)
    assert one == pytest.approx([other[2], other[0], other[1]])


def test_mix_only_is_all_traffic() -> None:
    # the view moves half its 10 tokens from small ($100/h, 90 other tokens) to large ($300/h, 100 others):
    # before $100 x 10 / 100 over 10 tokens = $1 a token; after 100 x 5/95 + 300 x 5/105 = $19.55 over 10
    before = payer(10, small=(100, 10, 90), large=(300, 0, 100))
    after = payer(10, small=(100, 5, 90), large=(300, 5, 100))
    assert level(after) == pytest.approx((100 * 5 / 95 + 300 * 5 / 105) / 10)
    assert parts(before, after) == {("traffic", ""): pytest.approx(level(after) - 1.0)}


def test_rate_only_is_all_spend() -> None:
    before = payer(20, small=(100, 20, 80))
    after = payer(20, small=(150, 20, 80))  # a replica added: $150 x 20%, over 20 tokens
    assert parts(before, after) == {("spend", "small"): pytest.approx(0.5)}


def test_a_tenant_moving_pools_owns_its_rise_and_the_tenant_left_behind_gets_the_volume() -> None:
    # small ($100/h) is shared by a and b (50 tokens each); large ($300/h) serves umbrella's 100.
    # a moves all of it to large: the totals stay the same (200 tokens, $400), the fleet's cost too.
    a_before, a_after = (
        payer(50, small=(100, 50, 50), large=(300, 0, 100)),
        payer(50, small=(100, 0, 50), large=(300, 50, 100)),
    )
    b_before, b_after = payer(50, small=(100, 50, 50)), payer(50, small=(100, 50, 0))
    # a: $1 -> $2 a token (a third of large's $300 over 50 tokens), all of it its own move; large's other
    # tokens did not change, and small's volume is not a's to pay: it left
    assert parts(a_before, a_after) == {("traffic", ""): pytest.approx(1.0)}
    # b: $1 -> $2 (all of small over its 50), all of it small's volume
    assert parts(b_before, b_after) == {("volume", "small"): pytest.approx(1.0)}
    assert parts(whole(200, small=100, large=300), whole(200, small=100, large=300), shared=False) == {}


def test_a_pool_appearing_shares_the_interaction_between_the_move_and_the_spend() -> None:
    # before: small only ($100/h, the view 10 of 100 tokens): $1 a token. After: large appears ($200/h) and the
    # view moves 5 tokens there, alone in it: 100 x 5/95 + 200 over 10 = $20.53. Large's term 200 / 10 = 20
    # needs both the move and the spend: Shapley gives each half (10); small's term falls by 1 - 0.526 by the move
    got = parts(payer(10, small=(100, 10, 90)), payer(10, small=(100, 5, 90), large=(200, 5, 0)))
    assert got == {("traffic", ""): pytest.approx(10 + 100 * 5 / 95 / 10 - 1), ("spend", "large"): pytest.approx(10)}


def test_a_pool_with_one_token_reads_as_a_pool_with_none() -> None:
    after = whole(500, small=100, large=300)
    # the fleet: large up before with 1 token an hour, or with none: its spend is the fleet's either way
    one, none = whole(1001, small=100, large=300), whole(1000, small=100, large=300)
    a, b = parts(one, after, shared=False), parts(none, after, shared=False)
    assert set(a) == set(b) and all(a[k] == pytest.approx(b[k], rel=0.01) for k in a)
    # a tenant in small; large's 1 token is someone else's, or large served nothing
    t_after = payer(10, small=(100, 10, 40), large=(300, 0, 200))
    one_t = payer(10, small=(100, 10, 90), large=(300, 0, 1))
    none_t = payer(10, small=(100, 10, 90), large=(300, 0, 0))
    a, b = parts(one_t, t_after), parts(none_t, t_after)
    assert set(a) == set(b) and all(a[k] == pytest.approx(b[k], rel=0.01) for k in a)
    # the tenant's own single token an hour (of its 1,000) beside 10,000 others in large, or none there
    t_after = payer(1000, small=(100, 1000, 4000), large=(300, 0, 10000))
    one_own = parts(payer(1000, small=(100, 999, 9000), large=(300, 1, 10000)), t_after)
    none_own = parts(payer(1000, small=(100, 1000, 9000), large=(300, 0, 10000)), t_after)
    change = level(t_after) - level(payer(1000, small=(100, 1000, 9000)))
    for key in set(one_own) | set(none_own):
        assert abs(one_own.get(key, 0.0) - none_own.get(key, 0.0)) < 0.01 * abs(change), (key, one_own, none_own)


def test_when_a_tenant_sent_its_tokens_is_its_own_traffic_not_the_others_volume() -> None:
    # large ($300/h) serves 10,000 other tokens an hour, before and after. Before, the view's single token came in a
    # minute the others left quiet: it paid that minute alone ($5 of the hour's $300), far more than its share of
    # the hour's tokens. After, its 5,000 tokens came evenly. The others' tokens did not change: no volume part.
    quiet = side(1000, small=(100, 100 * 999 / 9999, 999, 9000), large=(300, 5.0, 1, 10000))
    none = side(1000, small=(100, 10.0, 1000, 9000), large=(300, 0.0, 0, 10000))
    after = side(6000, small=(100, 10.0, 1000, 9000), large=(300, 300 * 5000 / 15000, 5000, 10000))
    for before in (quiet, none):  # with the token in a quiet minute, or no token in large at all
        got = parts(before, after)
        assert set(got) == {("traffic", "")}, got  # all of it the view's own doing


def test_offsetting_parts_are_said_in_dollars_never_as_shares_above_the_change() -> None:
    from datetime import UTC, datetime

    from analytics.explain.cost_model import CostExplanation, View
    from analytics.explain.cost_words import Words, sentence

    # a pool's spend up by $2 per 1M tokens, the view's own traffic down by $1.5: a change of +$0.5, whose
    # largest part is 400 % of it
    ex = CostExplanation(
        "tenant t", "request log (gateway)", 60, pd.DataFrame(), datetime(2026, 1, 1, tzinfo=UTC), 1.0, 1.5
    )
    ex.evidence = pd.DataFrame(
        [("spend", "small", 2.0, 4.0, ""), ("traffic", "", -1.5, -3.0, "")],
        columns=["kind", "pool", "usd_per_million", "share", "detail"],
    )
    ex.movers = pd.DataFrame(columns=["tenant", "to_pool", "share_before", "share_after", "route", "example"])
    table = pd.DataFrame(
        {"spend": [100.0], "other_weighted": [50.0], "view_tokens": [100.0], "replicas": [1.0], "idle_share": [0.0]},
        index=pd.Index(["small"], name="pool"),
    )
    words = Words(
        View("tenant t", "tenant", "t", "tenant"),
        table,
        table.assign(spend=200.0, view_tokens=200.0),
        (100.0, 200.0),
        pd.DataFrame(),
        ex.movers,
    )
    said = sentence(ex, words)
    assert "small's spend per hour +100% (+$2)" in said, said
    assert "partly offset by tenant t sending 100% more tokens per hour (-$1.5)" in said, said
    assert "% of the change" not in said, said


def test_an_adapter_is_costed_in_its_base_pool_with_the_base_models_requests() -> None:
    # an adapter's requests share the base model's pool ($120/h) with the base model's own (its "others");
    # when the base model's traffic halves, the adapter's unchanged 30 tokens pay half the pool instead of a third
    before = payer(30, base=(120, 30, 60))
    after = payer(30, base=(120, 30, 30))
    assert level(before) == pytest.approx(120 / 3 / 30) and level(after) == pytest.approx(120 / 2 / 30)
    assert parts(before, after) == {("volume", "base"): pytest.approx(20 / 30)}


def test_weights_decide_the_share_and_so_the_parts() -> None:
    # the same tokens (10 prompt + 10 output for the view, 40 + 0 for the others), priced 1 : 4 or 1 : 1;
    # the others' prompts halve. At 1 : 4 the view weighs 50 against 40 -> 25; at 1 : 1, 20 against 40 -> 20
    def w(prompt: float, output: float, ratio: float) -> float:
        return prompt + ratio * output

    for ratio, share_before, share_after in ((4.0, 50 / 90, 50 / 70), (1.0, 20 / 60, 20 / 40)):
        before = payer(20, pool=(100, w(10, 10, ratio), w(40, 0, ratio)))
        after = payer(20, pool=(100, w(10, 10, ratio), w(20, 0, ratio)))
        expected = 100 * (share_after - share_before) / 20
        assert parts(before, after) == {("volume", "pool"): pytest.approx(expected)}


def test_parts_add_up_and_no_side_may_be_empty() -> None:
    before = payer(50, small=(100, 40, 60), large=(300, 10, 50))
    after = payer(40, small=(120, 10, 30), large=(280, 30, 110))
    got = parts(before, after)  # parts() checks the sum; here every kind takes part
    assert {k for k, _p in got} == {"traffic", "volume", "spend"}
    with pytest.raises(ValueError, match="no tokens served before the break"):
        decompose(payer(0, small=(100, 0, 10)), payer(10, small=(100, 10, 10)), shared=True)


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
    for words in ("tiny-small's spend shared with", "acme", "long prompt (", "tenant globex"):
        assert words in ex.sentence, (words, ex.sentence)
    doc = ex.to_dict()
    assert doc["break_at"].endswith("Z") and doc["change_usd_per_million"] == pytest.approx(ex.after - ex.before)
    assert {"kind", "pool", "usd_per_million", "share", "detail"} <= set(doc["decomposition"][0])


@pytest.mark.parametrize("view", [None, Filters(tenant="acme"), Filters(tenant="globex"), Filters(model="tiny-small")])
def test_no_part_quoted_is_larger_than_the_change(shift, view) -> None:
    """The fleet and tenant views of router-shift: every part in the sentence and the evidence's first rows
    is at most the whole change, and the view's own traffic is one row however many pools it crossed."""
    ex = explain_cost(shift.client, shift.start, shift.end, PRICES, filters=view)
    assert ex.break_at is not None, ex.sentence
    assert (ex.evidence["share"].head(3).abs() <= 1.0 + 1e-9).all(), ex.evidence
    quoted = [int(p) for p in re.findall(r"(\d+)% of the change", ex.sentence)]
    assert quoted and all(p <= 100 for p in quoted), ex.sentence
    assert (ex.decomposition["kind"] == "traffic").sum() == 1


def test_acme_moving_back_is_its_own_traffic(shift) -> None:
    # at +23 min acme's prompts shrink back: its tokens leave tiny-large for tiny-small, and fewer of them
    ex = explain_cost(shift.client, shift.start, shift.end, PRICES, filters=Filters(tenant="acme"))
    assert ex.break_at is not None and abs((ex.break_at - shift.phase("acme-back")).total_seconds()) <= 2 * ex.step
    top = ex.evidence.iloc[0]
    assert top["kind"] == "traffic" and top["share"] >= 0.8
    assert "acme's tokens moving from tiny-large to tiny-small" in ex.sentence, ex.sentence


def test_router_shift_reads_one_number_everywhere(shift) -> None:
    """The showback, the series and explain, before and after acme's move, for the fleet, both pools and
    every tenant; with other token weights too."""
    views = [None, Filters(model="tiny-small"), Filters(model="tiny-large")]
    views += [Filters(tenant=t) for t in ("acme", "globex", "initech", "umbrella")]
    at = shift.phase("acme-long-prompts")
    for weights in (None, TokenWeights(input=1, cached=0.1, output=8)):
        rows = figures(shift.client, (shift.start, shift.end), PRICES, views, at=at, weights=weights)
        assert len(rows) == 14 and not disagreements(rows), pd.DataFrame(rows).to_string()


@pytest.fixture(scope="module")
def thrash(chdb_dir):
    return play(chdb_dir, "adapter-thrash", seed=1, spec="fleet-spec-lora.yaml")


def test_adapters_read_one_number_in_their_base_pool(thrash) -> None:
    """adapter-thrash on fleet-spec-lora.yaml: each adapter, its base pool, the fleet and a tenant,
    before and after the adapters take off."""
    adapters = ["support-bot", "legal-bot", "code-bot", "sql-bot"]
    views = [None, Filters(model="tiny-small"), Filters(tenant="acme"), *(Filters(model=a) for a in adapters)]
    at = thrash.phase("adapters-take-off")
    for weights in (None, TokenWeights(input=1, cached=0.1, output=8)):
        rows = figures(
            thrash.client, (thrash.start, thrash.end), PRICES, views, at=at, adapters=adapters, weights=weights
        )
        assert len(rows) == 14 and not disagreements(rows), pd.DataFrame(rows).to_string()
    # an adapter's cost is its share of tiny-small's spend over its own tokens: the same order as the pool's
    pool = {r["period"]: r["explain"] for r in rows if r["view"] == "model tiny-small"}
    for r in rows:
        if r["view"].startswith("adapter "):
            assert 0.3 * pool[r["period"]] < r["explain"] < 3 * pool[r["period"]], r


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
    outside = explain_cost(shift.client, shift.start, shift.end, PRICES, at=shift.end + timedelta(hours=1))
    assert outside.break_at is None and "is not inside the steps that served tokens" in outside.sentence
