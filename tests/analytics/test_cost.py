"""GPU spend from replica uptime and cost per 1M tokens by tenant, on hand-made rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from analytics.cost import cost_by_tenant, gpu_spend
from collector.convert import fingerprint
from migrations import clickhouse_runner

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)


def fleet(ch) -> None:  # noqa: ANN001
    clickhouse_runner.apply(ch)
    series, samples = [], []
    # a: 1 GPU up the whole 2 hours; b: 4 GPUs, up for the first 30 minutes only
    for replica, gpus, minutes in (("a", "1", 120), ("b", "4", 30)):
        labels = {"replica": replica, "model": "m", "gpu_type": "H100", "gpu_count": gpus, "model_name": "m"}
        fp = fingerprint("vllm:num_requests_running", labels)
        series.append({"fingerprint": fp, "metric": "vllm:num_requests_running", "original_metric": "vllm:num_requests_running",
                       "labels": labels, "first_seen": T0, "last_seen": T0})
        for m in range(minutes):
            for s in (0, 15, 30, 45):
                samples.append({"metric": "vllm:num_requests_running", "fingerprint": fp,
                                "ts": T0 + timedelta(minutes=m, seconds=s), "value": 1.0})
    ch.insert_df("series", pd.DataFrame(series))
    ch.insert_df("samples", pd.DataFrame(samples))
    requests = []
    for tenant, prompt, completion, cached, n in (("acme", 1000, 100, 0, 30), ("globex", 200, 400, 100, 10)):
        for i in range(n):
            requests.append({"ts": T0 + timedelta(minutes=i), "source": "gateway", "request_id": f"{tenant}-{i}",
                             "tenant": tenant, "model": "m", "prompt_tokens": prompt, "completion_tokens": completion,
                             "cached_tokens": cached, "weight": 2.0})
    ch.insert_df("requests", pd.DataFrame(requests))


def test_spend_counts_each_replica_s_uptime_gpus_and_price(ch) -> None:  # noqa: ANN001
    fleet(ch)
    for tier in ("raw", "1m", "1h"):
        df = gpu_spend(ch, T0, T0 + timedelta(hours=2), {"H100": 3.0}, tier=tier).set_index("replica")
        assert df.loc["a", "spend"] == pytest.approx(2 * 1 * 3.0), tier  # 2 h x 1 GPU x $3
        # b was up 30 minutes: exact at minute resolution, a whole hour on the hourly tier
        expected_b = (1.0 if tier == "1h" else 0.5) * 4 * 3.0
        assert df.loc["b", "spend"] == pytest.approx(expected_b), tier


def test_a_missing_price_is_an_error_not_free(ch) -> None:  # noqa: ANN001
    fleet(ch)
    with pytest.raises(KeyError, match="no GPU price for 'H100'"):
        gpu_spend(ch, T0, T0 + timedelta(hours=2), {"A100": 1.0})


def test_tenants_share_the_spend_by_weighted_tokens(ch) -> None:  # noqa: ANN001
    fleet(ch)
    df = cost_by_tenant(ch, T0, T0 + timedelta(hours=2), {"H100": 3.0}, input_weight=1, cached_weight=0.5,
                        output_weight=4, tier="raw").set_index("tenant")
    total = 2 * 3.0 + 0.5 * 4 * 3.0  # $12: idle time included, shared in proportion
    acme = 60 * (1000 * 1 + 100 * 4)  # weighted tokens (weight 2 x 30 rows)
    globex = 20 * (100 * 1 + 100 * 0.5 + 400 * 4)
    assert df["spend"].sum() == pytest.approx(total)
    assert df.loc["acme", "spend"] == pytest.approx(total * acme / (acme + globex))
    assert df.loc["globex", "cost_per_million_tokens"] == pytest.approx(
        total * globex / (acme + globex) / (20 * (200 + 400)) * 1e6)
    # output-heavy globex pays more per token than prompt-heavy acme
    assert df.loc["globex", "cost_per_million_tokens"] > df.loc["acme", "cost_per_million_tokens"]
