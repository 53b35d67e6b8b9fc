"""Why the prefix cache missed, on hand-built request sequences: every class, eviction by LRU
pressure, a replica restart, a prefix warm only on another model's replica, sampling weights,
and where affinity routing sends a prefix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from analytics.prefix import CLASSES, affinity_routes, classify, prefix_lengths

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def requests(*rows: tuple) -> pd.DataFrame:
    """(second, model, replica, prefix hash, prompt tokens, output tokens[, weight])."""
    return pd.DataFrame(
        [
            {
                "ts": T0 + timedelta(seconds=r[0]),
                "model": r[1],
                "replica": r[2],
                "tenant": "t",
                "prefix_hash": r[3],
                "prompt_tokens": r[4],
                "completion_tokens": r[5],
                "weight": r[6] if len(r) > 6 else 1.0,
            }
            for r in rows
        ]
    )


def classes(df: pd.DataFrame) -> list[str]:
    """Each request's class for its prefix part (the one with tokens, "unique" aside)."""
    return [next((c for c in CLASSES[:-1] if row[c] > 0), "unique") for _, row in df.iterrows()]


def test_a_prefix_is_new_then_a_hit_then_a_routing_miss_on_the_other_replica() -> None:
    df = classify(
        requests(
            (0, "m", "a", "P", 1000, 10),  # never seen: new prefix
            (1, "m", "a", "P", 800, 10),  # in a's cache: hit
            (2, "m", "b", "P", 600, 10),  # not in b's, warm on a: the router's miss
            (3, "m", "b", "P", 600, 10),  # now in b's too
        ),
        {"a": 10_000, "b": 10_000},
        prefix_tokens=256,
    )
    assert classes(df) == ["new_prefix", "hit", "routing", "hit"]
    assert df["new_prefix"].iloc[0] == 256 and df["unique"].iloc[0] == 1000 - 256  # the rest is nobody else's
    assert (df[list(CLASSES)].sum(axis=1) == df["prompt_tokens"]).all()  # every prompt token classed once


def test_lru_pressure_evicts_a_prefix_and_a_warm_one_survives() -> None:
    # a's cache holds 1,000 tokens: P (256) then 900 unique tokens of Q's request push P out
    df = classify(
        requests(
            (0, "m", "a", "P", 300, 0),  # P 256 + 44 pass-through
            (1, "m", "a", "Q", 656, 500),  # Q 256 + 400 + 500 output pass through: P is the oldest, gone
            (2, "m", "a", "P", 300, 0),  # seen before, in no cache now: evicted
            (3, "m", "a", "P", 300, 0),  # back in: hit
        ),
        {"a": 1000},
        prefix_tokens=256,
    )
    assert classes(df) == ["new_prefix", "unique", "evicted", "hit"]  # Q, on one request, is nobody's prefix


def test_a_restart_empties_the_cache() -> None:
    df = classify(
        requests((0, "m", "a", "P", 400, 5), (10, "m", "a", "P", 400, 5), (30, "m", "a", "P", 400, 5)),
        {"a": 100_000},
        prefix_tokens=256,
        restarts={"a": [T0 + timedelta(seconds=20)]},
    )
    assert classes(df) == ["new_prefix", "hit", "evicted"]


def test_a_prefix_warm_on_another_models_replica_is_no_routing_miss() -> None:
    df = classify(
        requests((0, "large", "L", "P", 400, 5), (1, "small", "s", "P", 400, 5)),
        {"L": 100_000, "s": 100_000},
        prefix_tokens=256,
    )
    # the router could not have sent it to L, and no small replica ever held it: new to this model
    assert classes(df) == ["new_prefix", "new_prefix"]


def test_a_sampled_row_passes_its_weight_of_tokens_through_the_cache() -> None:
    rows = ((0, "m", "a", "P", 300, 0), (1, "m", "a", "", 100, 100, 1.0), (2, "m", "a", "P", 300, 0))
    kept = classify(requests(*rows), {"a": 1000}, prefix_tokens=256)
    assert classes(kept) == ["new_prefix", "unique", "hit"]  # 200 tokens pass: P stays
    heavy = ((0, "m", "a", "P", 300, 0), (1, "m", "a", "", 100, 100, 5.0), (2, "m", "a", "P", 300, 0))
    pushed = classify(requests(*heavy), {"a": 1000}, prefix_tokens=256)
    assert classes(pushed) == ["new_prefix", "unique", "evicted"]  # a row for 5 requests: 1,000 tokens


def test_affinity_sends_a_prefix_to_one_replica_of_its_model() -> None:
    df = requests(
        *[(i, "m", r, f"P{i % 3}", 300, 10) for i, r in enumerate("abababababab")], (20, "n", "x", "P0", 9, 1)
    )
    routed = affinity_routes(df)
    for key, group in df.assign(to=routed).groupby("prefix_hash"):
        assert group.loc[group["model"] == "m", "to"].nunique() == 1, key
    assert routed.iloc[-1] == "x"  # the only replica of its model
    assert set(routed[df["model"] == "m"]) <= {"a", "b"}
    # the same requests routed so: each prefix misses once, then hits
    again = classify(df.assign(replica=routed), {"a": 10_000, "b": 10_000, "x": 10_000}, prefix_tokens=8)
    spread = classify(df, {"a": 10_000, "b": 10_000, "x": 10_000}, prefix_tokens=8)
    assert again["hit"].sum() > spread["hit"].sum()
    assert again["routing"].sum() == 0 and spread["routing"].sum() > 0


def test_the_classes_do_not_depend_on_the_rows_order() -> None:
    df = requests((0, "m", "a", "P", 400, 5), (1, "m", "b", "P", 400, 5), (2, "m", "a", "P", 400, 5))
    assert classes(classify(df.iloc[::-1], {"a": 9999, "b": 9999})) == ["new_prefix", "routing", "hit"]
    with pytest.raises(KeyError):
        classify(df.drop(columns=["weight"]), {})


def test_a_prefix_is_as_long_as_the_cached_tokens_reported_for_its_hash() -> None:
    rows = requests((0, "m", "a", "P", 1000, 10), (1, "m", "a", "P", 900, 10), (2, "m", "a", "", 500, 10))
    rows["cached_tokens"] = [0, 512, 0]
    lengths = prefix_lengths(rows)
    assert (
        lengths == {"P": 512}
    )  # (the median of the counts reported: here one)  # the hashed 64 tokens were the start of a 512-token system prompt
    df = classify(rows, {"a": 10_000}, prefix_tokens=64, lengths=lengths)
    assert list(df["new_prefix"]) == [512, 0, 0] and list(df["hit"]) == [0, 512, 0]
    assert df["unique"].iloc[2] == 500  # a prompt without a hash shares nothing


def test_a_prompt_no_other_request_shares_is_unique_not_a_new_prefix() -> None:
    df = classify(
        requests((0, "m", "a", "X", 300, 5), (1, "m", "a", "Y", 300, 5, 3.0), (2, "m", "a", "Y", 300, 5)),
        {"a": 10_000},
        prefix_tokens=64,
    )
    # X: one request in the window, its hash shared by nobody; Y: a sampled row standing for three
    assert classes(df) == ["unique", "new_prefix", "hit"] and df["unique"].iloc[0] == 300
