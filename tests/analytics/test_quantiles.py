"""Quantiles: histogram buckets against Prometheus' own algorithm; weighted exact quantiles
from request rows against numpy."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.metrics import bucket_quantile
from analytics.requests import request_quantile
from migrations import clickhouse_runner

INF = math.inf


def prometheus_bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """A line-by-line transcription of bucketQuantile in Prometheus' promql/quantile.go
    (buckets: (upper bound, cumulative count)); the reference, written apart from ours."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -INF
    if q > 1:
        return INF
    buckets = sorted(buckets)
    if not math.isinf(buckets[-1][0]):
        return math.nan
    merged: list[list[float]] = []  # coalesceBuckets
    for upper, count in buckets:
        if merged and merged[-1][0] == upper:
            merged[-1][1] += count
        else:
            merged.append([upper, count])
    for i in range(1, len(merged)):  # ensureMonotonic
        merged[i][1] = max(merged[i][1], merged[i - 1][1])
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return math.nan if count == 0 else start + (end - start) * (rank / count)


def ours(q: float, buckets: list[tuple[float, float]]) -> float:
    buckets = sorted(buckets)
    return bucket_quantile(q, np.array([b for b, _ in buckets]), np.array([c for _, c in buckets], dtype=float))


CASES = {
    "typical": [(0.1, 2), (0.5, 10), (1.0, 14), (INF, 15)],
    "only +Inf": [(INF, 7)],
    "empty": [(0.1, 0), (1.0, 0), (INF, 0)],
    "single finite bucket": [(2.5, 4), (INF, 4)],
    "rank in +Inf": [(0.1, 1), (0.2, 2), (INF, 10)],
    "first bound negative": [(-1.0, 5), (0.0, 6), (INF, 6)],
    "first bound zero": [(0.0, 3), (1.0, 5), (INF, 5)],
    "not monotonic (a reset mid-window)": [(0.1, 5), (0.5, 4), (1.0, 9), (INF, 9)],
    "no +Inf bucket": [(0.1, 1), (1.0, 2)],
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("q", [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0, -0.5, 1.5])
def test_bucket_quantile_matches_prometheus_on_hand_made_buckets(name: str, q: float) -> None:
    want, got = prometheus_bucket_quantile(q, CASES[name]), ours(q, CASES[name])
    assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want), (name, q, want, got)


def test_a_known_answer() -> None:
    # 15 observations; p50 is rank 7.5: in (0.1, 0.5], 5.5 of its 8 -> 0.1 + 0.4 * 5.5 / 8
    assert ours(0.5, CASES["typical"]) == pytest.approx(0.375)
    assert ours(0.99, CASES["rank in +Inf"]) == 0.2  # the highest finite bound
    assert math.isnan(ours(0.5, CASES["empty"]))


@settings(max_examples=300, deadline=None)
@given(
    bounds=st.lists(st.floats(-5, 100, allow_nan=False), min_size=1, max_size=8, unique=True),
    counts=st.lists(st.integers(0, 50), min_size=9, max_size=9),
    q=st.floats(0, 1),
)
def test_bucket_quantile_matches_prometheus_on_random_buckets(bounds: list[float], counts: list[int], q: float) -> None:
    bounds = sorted(bounds)
    cumulative = np.cumsum(counts[: len(bounds) + 1]).tolist()
    buckets = list(zip([*bounds, INF], cumulative, strict=True))
    want, got = prometheus_bucket_quantile(q, buckets), ours(q, buckets)
    assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_weighted_exact_quantiles_match_numpy(ch) -> None:
    clickhouse_runner.apply(ch)
    rng = np.random.default_rng(5)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    ttft = rng.gamma(2.0, 0.2, 400).astype(np.float32)
    weights = rng.choice([1.0, 1.0, 2.0, 5.0], 400)
    model = np.where(np.arange(400) % 2 == 0, "a", "b")
    ch.insert_df(
        "requests",
        pd.DataFrame(
            {
                "ts": [t0 + timedelta(seconds=i) for i in range(400)],
                "source": "gateway",
                "request_id": [f"r{i}" for i in range(400)],
                "model": model,
                "ttft_seconds": ttft,
                "weight": weights,
            }
        ),
    )
    window = (t0, t0 + timedelta(minutes=30))
    for q in (0.5, 0.9, 0.99):
        got = request_quantile(ch, "ttft", q, *window, by=["model"], tier="raw").set_index("model")["value"]
        for m in ("a", "b"):
            mask = model == m
            # weights as repeated rows: the weighted quantile is the unweighted one of the repeats
            repeated = np.repeat(ttft[mask], weights[mask].astype(int))
            assert got[m] == pytest.approx(float(np.quantile(repeated, q, method="inverted_cdf")), rel=1e-6)
        unweighted = request_quantile(ch, "ttft", q, *window, by=[], tier="raw", source=None)["value"].iloc[0]
        assert unweighted == pytest.approx(
            float(np.quantile(np.repeat(ttft, weights.astype(int)), q, method="inverted_cdf")), rel=1e-6
        )
