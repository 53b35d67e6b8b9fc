"""Drift on hand-made request logs: identical windows show none; a shifted prompt-length
distribution and a new tenant are detected, with Evidently's test for the sample size; the
distances match scipy's on the same rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import jensenshannon
from scipy.stats import wasserstein_distance

from analytics.drift import drift, length_distribution, mix_shares, reference_window
from analytics.filters import Filters
from migrations import clickhouse_runner

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=2)
REF = (T0, T0 + timedelta(hours=1))
CUR = (T0 + timedelta(hours=1), T0 + timedelta(hours=2))


def rows(
    window: tuple[datetime, datetime], n: int, seed: int, *, prompt_median: float = 300, tenants=None
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    tenants = tenants or {"acme": 0.6, "globex": 0.4}
    prompt = np.clip(rng.lognormal(np.log(prompt_median), 0.6, n), 1, 30000).astype(int)
    output = np.clip(rng.lognormal(np.log(80), 0.5, n), 1, 4000).astype(int)
    span = (window[1] - window[0]).total_seconds()
    return pd.DataFrame(
        {
            "ts": [window[0] + timedelta(seconds=float(s)) for s in np.sort(rng.uniform(0, span, n))],
            "source": "gateway",
            "request_id": [f"{seed}-{i}" for i in range(n)],
            "tenant": rng.choice(list(tenants), n, p=list(tenants.values())),
            "model": rng.choice(["small", "large"], n, p=[0.75, 0.25]),
            "route": "pinned/least_loaded",
            "finish_reason": "length",
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "max_tokens": output,
            "cached_tokens": (prompt * rng.uniform(0, 0.5, n)).astype(int),
            "weight": 1.0,
        }
    )


def load(ch, *frames: pd.DataFrame) -> None:
    clickhouse_runner.apply(ch)
    for frame in frames:
        ch.insert_df("requests", frame)


def test_reference_windows() -> None:
    assert reference_window(*CUR, "trailing-day") == (CUR[0] - timedelta(days=1), CUR[0])
    assert reference_window(*CUR, "last-week") == (CUR[0] - timedelta(days=7), CUR[1] - timedelta(days=7))
    with pytest.raises(ValueError, match="trailing-day"):
        reference_window(*CUR, "yesterday")


def test_identical_windows_show_no_drift(ch) -> None:
    ref = rows(REF, 3000, seed=1)
    same = ref.assign(ts=ref["ts"] + timedelta(hours=1), request_id=ref["request_id"] + "-copy")
    load(ch, ref, same)
    df = drift(ch, CUR, REF).set_index("feature")
    assert set(df["test"]) == {"wasserstein", "jensenshannon"}  # more than 1,000 reference rows
    assert (df["score"].abs() < 1e-9).all() and not df["drifted"].any()
    assert df.attrs["share_drifted"] == 0 and not df.attrs["dataset_drift"]


def test_same_distribution_fresh_draws_show_no_drift(ch) -> None:
    load(ch, rows(REF, 3000, seed=1), rows(CUR, 3000, seed=2))
    df = drift(ch, CUR, REF)
    assert not df["drifted"].any(), df


def test_longer_prompts_and_a_new_tenant_are_detected_with_distance_tests(ch) -> None:
    ref = rows(REF, 3000, seed=1)
    cur = rows(CUR, 3000, seed=2, prompt_median=600, tenants={"acme": 0.45, "globex": 0.3, "bigcorp": 0.25})
    load(ch, ref, cur)
    df = drift(ch, CUR, REF).set_index("feature")
    assert df.loc["prompt_tokens", "test"] == "wasserstein" and df.loc["prompt_tokens", "drifted"]
    assert df.loc["tenant", "test"] == "jensenshannon" and df.loc["tenant", "drifted"]
    assert "bigcorp 0% -> 25%" in df.loc["tenant", "detail"]
    assert not df.loc["output_tokens", "drifted"] and not df.loc["model", "drifted"]
    # the distances are the textbook ones (scipy on the same rows)
    expected = wasserstein_distance(ref["prompt_tokens"], cur["prompt_tokens"]) / ref["prompt_tokens"].std(ddof=0)
    assert df.loc["prompt_tokens", "score"] == pytest.approx(expected, rel=0.03)
    names = ["acme", "bigcorp", "globex"]
    p = ref["tenant"].value_counts(normalize=True).reindex(names, fill_value=0)
    q = cur["tenant"].value_counts(normalize=True).reindex(names, fill_value=0)
    assert df.loc["tenant", "score"] == pytest.approx(jensenshannon(p, q), rel=1e-6)
    shares = df.attrs["shares"]["tenant"].set_index("value")
    assert shares.loc["bigcorp", "reference_requests_share"] == 0
    assert shares.loc["bigcorp", "current_requests_share"] == pytest.approx(q["bigcorp"])


def test_small_samples_use_ks_and_chi_square(ch) -> None:
    ref = rows(REF, 400, seed=3)
    cur = rows(CUR, 400, seed=4, prompt_median=600, tenants={"acme": 0.45, "globex": 0.3, "bigcorp": 0.25})
    load(ch, ref, cur)
    df = drift(ch, CUR, REF).set_index("feature")
    assert df.loc["prompt_tokens", "test"] == "ks" and df.loc["prompt_tokens", "drifted"]
    assert df.loc["prompt_tokens", "score"] < 0.05  # a p-value
    assert df.loc["tenant", "test"] == "chisquare" and df.loc["tenant", "drifted"]
    assert not df.loc["model", "drifted"]


def test_small_identical_samples_show_no_drift(ch) -> None:
    ref = rows(REF, 400, seed=3)
    load(ch, ref, ref.assign(ts=ref["ts"] + timedelta(hours=1), request_id=ref["request_id"] + "-copy"))
    df = drift(ch, CUR, REF)
    assert not df["drifted"].any() and (df["score"] > 0.99).all()


def test_filters_and_token_shares(ch) -> None:
    cur = rows(CUR, 2000, seed=2, tenants={"acme": 0.5, "bigcorp": 0.5})
    cur.loc[cur["tenant"] == "bigcorp", "prompt_tokens"] *= 4  # bigcorp's requests are long
    load(ch, rows(REF, 2000, seed=1), cur)
    shares = mix_shares(ch, "tenant", CUR, REF).set_index("value")
    assert shares.loc["bigcorp", "current_requests_share"] == pytest.approx(0.5, abs=0.05)
    assert shares.loc["bigcorp", "current_tokens_share"] > 0.7  # a larger share of tokens than of requests
    only_acme = drift(ch, CUR, REF, filters=Filters(tenant="acme")).set_index("feature")
    assert not only_acme.loc["tenant", "drifted"] and only_acme.loc["tenant", "score"] < 0.1


def test_an_empty_window_is_a_clear_error(ch) -> None:
    load(ch, rows(REF, 100, seed=1))
    with pytest.raises(ValueError, match="current window holds no request-log rows"):
        drift(ch, CUR, REF)
    with pytest.raises(ValueError, match="overlaps"):
        drift(ch, CUR, (CUR[0] - timedelta(minutes=30), CUR[0] + timedelta(minutes=1)))


def test_shares_over_long_unaligned_windows_match_the_rows(ch) -> None:
    """Windows of days that start and end inside an hour: each row counts in its own window only."""
    data = rows((T0 - timedelta(days=3), T0 + timedelta(days=2)), 6000, seed=5)
    load(ch, data)
    ref_w = (T0 - timedelta(days=3) + timedelta(minutes=17, seconds=30), T0 + timedelta(minutes=7, seconds=20))
    cur_w = (T0 + timedelta(minutes=7, seconds=20), T0 + timedelta(days=2) - timedelta(minutes=13, seconds=10))
    shares = drift(ch, cur_w, ref_w).attrs["shares"]
    for w, (a, b) in (("reference", ref_w), ("current", cur_w)):
        frame = data[(data["ts"] >= a) & (data["ts"] < b)]
        bucket = pd.cut(frame["prompt_tokens"], [0, 2047, 8191, 32767, np.inf], labels=["<2k", "2-8k", "8-32k", ">32k"])
        tokens = frame["prompt_tokens"] + frame["completion_tokens"]
        got = shares["context_bucket"].set_index("value")
        for value, count in tokens.groupby(bucket, observed=True).sum().items():
            assert got.loc[value, f"{w}_tokens"] == pytest.approx(count)
            assert got.loc[value, f"{w}_rows"] == (bucket == value).sum()
        by_tenant = frame.groupby("tenant").size() / len(frame)
        assert shares["tenant"].set_index("value")[f"{w}_requests_share"].to_dict() == pytest.approx(
            by_tenant.to_dict()
        )


def test_a_reference_kept_only_in_the_hourly_rollup_still_compares_the_mix(ch) -> None:
    """Past the raw request log's retention the hourly rollup still has the mix: the shares are
    compared; the length distributions, which need the rows, say why they are not."""
    load(ch, rows(REF, 2000, seed=1))
    ch.command("TRUNCATE TABLE requests")  # as the raw log's TTL would: the hourly rollup keeps its rows
    ch.insert_df("requests", rows(CUR, 2000, seed=2, tenants={"acme": 0.2, "globex": 0.8}))
    df = drift(ch, CUR, REF).set_index("feature")
    assert df.loc["tenant", "reference_rows"] == 2000 and df.loc["tenant", "drifted"]  # 60/40 -> 20/80
    assert not df.loc["model", "drifted"]
    numeric = df[df["kind"] == "numeric"]
    assert numeric["score"].isna().all() and not numeric["drifted"].any()
    assert numeric["detail"].str.contains("retention").all()


def test_length_distributions_share_log_bins_and_count_every_request(ch) -> None:
    ref, cur = rows(REF, 1500, seed=1), rows(CUR, 1200, seed=2, prompt_median=1200)
    load(ch, ref, cur)
    dist = length_distribution(ch, "prompt_tokens", CUR, REF)
    by_window = {w: f.reset_index(drop=True) for w, f in dist.groupby("window")}
    assert (
        (by_window["reference"][["low", "high"]] == by_window["current"][["low", "high"]]).all().all()
    )  # the same bins
    longest = max(ref["prompt_tokens"].max(), cur["prompt_tokens"].max())
    assert dist["low"].min() == 1 and dist["high"].max() > longest >= dist["low"].max()
    for w, frame in (("reference", ref), ("current", cur)):
        got = by_window[w]
        assert got["requests"].sum() == pytest.approx(len(frame)) and got["share"].sum() == pytest.approx(1)
        # each request in the bin that holds its length
        expected = [
            ((frame["prompt_tokens"] >= lo) & (frame["prompt_tokens"] < hi)).sum()
            for lo, hi in zip(got["low"], got["high"], strict=True)
        ]
        assert got["requests"].tolist() == pytest.approx(expected)
    # the current prompts are four times as long: most of its requests sit in higher bins
    median_bin = {w: f.loc[f["share"].cumsum() >= 0.5, "low"].iloc[0] for w, f in by_window.items()}
    assert median_bin["current"] > median_bin["reference"]
