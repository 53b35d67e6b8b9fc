"""Quality rates (analytics.quality) on hand-written request rows in chDB: by model, tenant and over
time they equal the rates computed by hand; weights count, rows not evaluated do not, engine rows
are not read, and a group with nothing evaluated has NaN rates."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from analytics.errors import BadInput
from analytics.filters import Filters
from analytics.quality import quality_rates
from collector.request_columns import QUALITY_DEFAULTS
from migrations import clickhouse_runner

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
WINDOW = (T0, T0 + timedelta(minutes=10))
# the quality columns' types in the store (migration 0014)
TYPES = {
    "evaluated": "uint8",
    "truncated": "uint8",
    "empty_answer": "uint8",
    "refusal": "uint8",
    "repetition": "float32",
    "json_valid": "int8",
    "answer_chars": "uint32",
}
RATES = ["truncation_rate", "refusal_rate", "empty_rate", "repetition", "json_invalid_rate"]


def row(minute: float, model: str, tenant: str, weight: float = 1.0, **quality: Any) -> dict[str, Any]:
    return {
        "ts": T0 + timedelta(minutes=minute),
        "source": "gateway",
        "gateway": "fleetscope",
        "model": model,
        "tenant": tenant,
        "weight": weight,
        **{**QUALITY_DEFAULTS, **quality},
    }


# (minute, model, tenant, weight, evaluated fields); model "small" evaluated, "large" never
ROWS = [
    row(1, "small", "acme", 1.0, evaluated=1, truncated=1, repetition=0.5, json_valid=0),
    row(2, "small", "acme", 3.0, evaluated=1, refusal=1, repetition=0.1, json_valid=1),
    row(3, "small", "beta", 2.0, evaluated=1, empty_answer=1),  # JSON not asked: json_valid -1
    row(6, "small", "beta", 4.0, evaluated=1, truncated=1, refusal=1, json_valid=0),
    # not evaluated: scores a stray sender wrote are not read, the row counts only in ``requests``
    row(4, "small", "acme", 5.0, truncated=1, refusal=1, json_valid=0),
    row(2, "large", "acme", 2.0),
    row(7, "large", "beta", 1.0),
    # an engine span of the first request, had it scores: not read (source otlp)
    {**row(1, "small", "", 1.0, evaluated=1, refusal=1), "source": "otlp", "gateway": ""},
    # outside the window
    row(12, "small", "acme", 1.0, evaluated=1, refusal=1),
]


def insert(ch: Any, rows: list[dict[str, Any]]) -> None:
    clickhouse_runner.apply(ch)
    ch.insert_df("requests", pd.DataFrame(rows).astype(TYPES))


@pytest.fixture
def store(ch: Any) -> Any:
    insert(ch, ROWS)
    return ch


def expected(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The rates of ``rows`` computed by hand from the definitions (analytics.quality)."""
    evaluated = [r for r in rows if r["evaluated"] == 1]
    n = sum(r["weight"] for r in evaluated)
    json_asked = [r for r in evaluated if r["json_valid"] >= 0]
    asked = sum(r["weight"] for r in json_asked)
    share = lambda key: sum(r["weight"] for r in evaluated if r[key] == 1) / n if n else math.nan  # noqa: E731
    return {
        "requests": sum(r["weight"] for r in rows),
        "evaluated": n,
        "truncation_rate": share("truncated"),
        "refusal_rate": share("refusal"),
        "empty_rate": share("empty_answer"),
        "repetition": sum(r["weight"] * r["repetition"] for r in evaluated) / n if n else math.nan,
        "json_asked": asked,
        "json_invalid_rate": sum(r["weight"] for r in json_asked if r["json_valid"] == 0) / asked
        if asked
        else math.nan,
    }


def in_window(**match: Any) -> list[dict[str, Any]]:
    return [
        r
        for r in ROWS
        if r["source"] == "gateway" and WINDOW[0] <= r["ts"] < WINDOW[1] and all(r[k] == v for k, v in match.items())
    ]


def same(got: pd.Series, want: dict[str, float]) -> None:
    for name, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[name]), (name, got[name])
        else:
            assert got[name] == pytest.approx(value, rel=1e-6), (name, got[name], value)


def test_rates_by_model_equal_the_hand_computed_ones(store: Any) -> None:
    df = quality_rates(store, *WINDOW, by="model").set_index("model")
    assert sorted(df.index) == ["large", "small"]
    want = expected(in_window(model="small"))
    # by hand: evaluated weight 1 + 3 + 2 + 4 = 10; truncated 1 + 4; refused 3 + 4; empty 2;
    # repetition (0.5 + 0.3) / 10; JSON asked 1 + 3 + 4, invalid 1 + 4
    assert want == {
        "requests": 15.0,
        "evaluated": 10.0,
        "truncation_rate": 0.5,
        "refusal_rate": 0.7,
        "empty_rate": 0.2,
        "repetition": pytest.approx(0.08),
        "json_asked": 8.0,
        "json_invalid_rate": 0.625,
    }
    same(df.loc["small"], want)
    # nothing of the large model was evaluated: its requests count, its rates are NaN
    same(df.loc["large"], expected(in_window(model="large")))
    assert df.loc["large", "evaluated"] == 0 and df.loc["large", ["requests"]].iloc[0] == 3.0
    assert df.loc["large", RATES].isna().all()


def test_rates_by_tenant_and_with_a_filter(store: Any) -> None:
    df = quality_rates(store, *WINDOW, by="tenant").set_index("tenant")
    for tenant in ("acme", "beta"):
        same(df.loc[tenant], expected(in_window(tenant=tenant)))
    assert df.loc["acme", "refusal_rate"] == pytest.approx(0.75)  # 3 of the 4 evaluated (weights 1 + 3)
    only = quality_rates(store, *WINDOW, by=["model", "tenant"], filters=Filters(tenant="beta"))
    assert set(only["tenant"]) == {"beta"}
    same(only.set_index("model").loc["small"], expected(in_window(model="small", tenant="beta")))


def test_rates_over_time_per_step(store: Any) -> None:
    df = quality_rates(store, *WINDOW, by="model", step_s=300)
    assert df.attrs["step"] == 300
    small = df[df["model"] == "small"].set_index("ts")
    first, second = pd.Timestamp(T0), pd.Timestamp(T0 + timedelta(minutes=5))
    assert list(small.index) == [first, second]
    same(small.loc[first], expected([r for r in in_window(model="small") if r["ts"] < T0 + timedelta(minutes=5)]))
    same(small.loc[second], expected([r for r in in_window(model="small") if r["ts"] >= T0 + timedelta(minutes=5)]))
    assert small.loc[second, "truncation_rate"] == 1.0 and small.loc[second, "json_invalid_rate"] == 1.0


def test_weights_count_and_unevaluated_rows_do_not(ch: Any) -> None:
    """One refusal of weight 9 beside one good answer of weight 1 is a 90 % refusal rate; a row not
    evaluated (here with refusal = 1 written by mistake) changes no rate."""
    insert(
        ch,
        [
            row(1, "m", "t", 9.0, evaluated=1, refusal=1),
            row(2, "m", "t", 1.0, evaluated=1),
            row(3, "m", "t", 50.0, evaluated=0, refusal=1),
        ],
    )
    got = quality_rates(ch, *WINDOW, by=None).iloc[0]
    assert got["refusal_rate"] == pytest.approx(0.9) and got["evaluated"] == 10.0 and got["requests"] == 60.0
    assert math.isnan(got["json_invalid_rate"])  # no evaluated request asked for JSON


def test_no_evaluated_rows_give_nan_and_an_empty_window_no_rows(ch: Any) -> None:
    insert(ch, [row(1, "m", "t", 2.0)])
    df = quality_rates(ch, *WINDOW, by="model")
    assert len(df) == 1 and df.loc[0, "evaluated"] == 0 and df.loc[0, RATES].isna().all()
    empty = quality_rates(ch, T0 - timedelta(hours=2), T0 - timedelta(hours=1), by="model")
    assert empty.empty and {"model", "evaluated", *RATES} <= set(empty.columns)
    assert quality_rates(ch, T0 - timedelta(hours=2), T0 - timedelta(hours=1), by=None).empty


def test_bad_arguments_are_refused_with_what_is_allowed(ch: Any) -> None:
    with pytest.raises(BadInput, match="cannot group quality rates by 'adapter'; one of model, tenant"):
        quality_rates(ch, *WINDOW, by="adapter")
    with pytest.raises(BadInput, match="step_s must be at least 1 second"):
        quality_rates(ch, *WINDOW, step_s=0.5)
    with pytest.raises(BadInput, match="must end after it starts"):
        quality_rates(ch, WINDOW[1], WINDOW[0])
