"""Rollups answer what the raw tables answer: counters across resets, gauges, histogram
quantiles and weighted request counts, on 2 h of simulated engines scraped every 15 s.

The data goes the real way: simulated vLLM expositions -> parser -> converter (which computes
the counter resets) -> writer -> chDB, where the materialized views fill the 1 min and 1 h
tiers. The reference numbers are computed here in Python from the scraped values.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analytics.counters import increase as raw_increase
from analytics.metrics import counter_increase, gauge_summary, histogram_quantile
from analytics.requests import request_quantile, request_quantiles, request_totals
from collector.convert import Batch, SeriesConverter
from collector.exposition import SeriesCache, parse
from collector.scrape import ScrapeResult
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from fleet.sim.engine import EngineConfig
from fleet.sim.virtual import VirtualReplica, run
from migrations import clickhouse_runner
from storage.clickhouse import connect

REPLICAS = [("r0", "small"), ("r1", "small"), ("r2", "large")]
INTERVAL = 15.0
TTFT = "vllm:time_to_first_token_seconds"


class History:
    """What was written, and the reference numbers computed from the scraped values."""

    def __init__(self) -> None:
        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        self.window = (now - timedelta(hours=3), now - timedelta(hours=1))  # two whole hours
        self.start = self.window[0] - timedelta(minutes=10)  # samples before the window: lookback
        self.end = self.window[1] + timedelta(minutes=5)
        # (replica, sample name with labels) -> reset-aware increase of its samples in the window
        self.increase: dict[tuple[str, str], float] = defaultdict(float)
        self.kv: dict[str, list[float]] = defaultdict(list)  # replica -> kv usage values in the window
        self.ttfts: dict[str, list[float]] = defaultdict(list)  # model -> true TTFTs finished in the window
        self.requests: list[dict] = []


@pytest.fixture(scope="module")
def history(chdb_dir: Path):
    database = f"t_{uuid.uuid4().hex[:12]}"
    client = connect(f"chdb:{chdb_dir}", database=database, create_database=True)
    clickhouse_runner.apply(client)
    h = History()
    writer = Writer(client, WriterConfig(spool_dir=chdb_dir.parent / f"spool-{database}"))
    replicas = [VirtualReplica(n, m, EngineConfig(num_blocks=192, max_model_len=2048)) for n, m in REPLICAS]
    converters = {n: SeriesConverter() for n, _ in REPLICAS}
    caches = {n: SeriesCache() for n, _ in REPLICAS}
    last: dict[tuple[str, str], float] = {}
    w0, w1 = (t.timestamp() for t in h.window)
    duration = (h.end - h.start).total_seconds()
    restart_after = (h.window[0] + timedelta(minutes=50)).timestamp() - h.start.timestamp()
    rng = np.random.default_rng(7)
    for scrape in run(
        replicas, h.start.timestamp(), duration, interval_s=INTERVAL, rate=0.4, restarts={"r1": restart_after}, seed=3
    ):
        target = make_target(
            f"127.0.0.1:{9000 + int(scrape.replica[1:])}",
            job="vllm",
            labels={"replica": scrape.replica, "model": scrape.model},
            interval_s=INTERVAL,
            timeout_s=5,
        )
        exposition = parse(scrape.text, cache=caches[scrape.replica])
        batch = Batch()
        converters[scrape.replica].convert(
            ScrapeResult(target, scrape.ts, True, 0.01, len(exposition), "", exposition), batch
        )
        for table, columns in batch.tables.items():
            writer.add(table, columns)
        inside = w0 <= scrape.ts < w1
        for line in scrape.text.splitlines():
            if line.startswith("#") or not line:
                continue
            name_labels, value_text = line.rsplit(" ", 1)
            value = float(value_text)
            key = (scrape.replica, name_labels)
            name = name_labels.split("{", 1)[0]
            if name.endswith(("_total", "_bucket", "_count", "_sum")) and not name.startswith(("python_", "process_")):
                prev = last.get(key)
                if inside and prev is not None:
                    h.increase[key] += value - prev if value >= prev else value
                last[key] = value
            if inside and name == "vllm:kv_cache_usage_perc":
                h.kv[scrape.replica].append(value)
        for request in scrape.finished:
            if w0 <= scrape.ts < w1 and request.first_token_at is not None:
                h.ttfts[scrape.model].append(request.first_token_at - request.arrival)
            weight = float(rng.choice([1.0, 4.0]))  # as if sampled at 100 % and 25 %
            h.requests.append(
                {
                    "ts": datetime.fromtimestamp(request.arrival, UTC),
                    "source": "gateway",
                    "request_id": request.request_id,
                    "trace_id": uuid.uuid4().hex,
                    "replica": scrape.replica,
                    "model": scrape.model,
                    "tenant": str(rng.choice(["acme", "globex", "initech"])),
                    "route": "model-router",
                    "status_code": 200,
                    "finish_reason": "length",
                    "prompt_tokens": request.prompt_len,
                    "completion_tokens": request.generated,
                    "cached_tokens": request.cached_tokens,
                    "max_tokens": request.max_tokens,
                    "ttft_seconds": (request.first_token_at or request.finished_at) - request.arrival,
                    "e2e_seconds": request.finished_at - request.arrival,
                    "weight": weight,
                }
            )
    assert writer.flush()
    frame = pd.DataFrame(h.requests)
    client.insert_df("requests", frame)
    yield client, h
    writer.close()
    client.command(f"DROP DATABASE IF EXISTS {database}")
    client.close()


def _by_replica(df: pd.DataFrame, column: str) -> dict[str, float]:
    return dict(zip(df["replica"], df[column], strict=True))


def _expected(h: History, sample: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (replica, name_labels), inc in h.increase.items():
        if name_labels.split("{", 1)[0] == sample:
            out[replica] += inc
    return dict(out)


@pytest.mark.parametrize(
    "metric",
    ["vllm:prompt_tokens_total", "vllm:generation_tokens_total", f"{TTFT}_count", "vllm:request_success_total"],
)
def test_counter_increase_agrees_on_every_tier_across_a_restart(history, metric: str) -> None:
    client, h = history
    expected = _expected(h, metric)
    assert expected["r1"] > 0 and expected["r0"] > 0
    reference = _by_replica(raw_increase(client, metric, *h.window), "increase")
    assert reference == pytest.approx(expected, rel=1e-9)
    for tier in ("raw", "1m", "1h"):
        df = counter_increase(client, metric, *h.window, by="replica", tier=tier)
        assert df.attrs["plan"].tier.name == tier
        assert _by_replica(df, "increase") == pytest.approx(expected, rel=1e-9), tier


def test_the_restart_is_counted_from_zero_not_lost_or_negative(history) -> None:
    client, h = history
    # r1 restarted 50 min into the window: its counter fell back to a small value
    values = client.query_df(
        "SELECT ts, value, reset FROM samples WHERE metric = 'vllm:generation_tokens_total' "
        "AND fingerprint IN (SELECT fingerprint FROM series WHERE replica = 'r1') ORDER BY ts"
    )
    drops = values[values["value"].diff() < 0]
    assert len(drops) == 1
    drop = drops.index[0]
    assert values.loc[drop, "reset"] == values.loc[drop - 1, "value"]  # the value before the reset
    assert (values.drop(index=drop)["reset"] == 0).all()


def test_gauge_min_max_avg_last_agree_on_every_tier(history) -> None:
    client, h = history
    for tier in ("raw", "1m", "1h"):
        df = gauge_summary(client, "vllm:kv_cache_usage_perc", *h.window, by="replica", tier=tier).set_index("replica")
        for replica, values in h.kv.items():
            assert df.loc[replica, "min"] == pytest.approx(min(values)), tier
            assert df.loc[replica, "max"] == pytest.approx(max(values)), tier
            assert df.loc[replica, "avg"] == pytest.approx(sum(values) / len(values), rel=1e-9), tier
            assert df.loc[replica, "last"] == pytest.approx(values[-1]), tier
    assert max(max(v) for v in h.kv.values()) > 0  # the engines were busy at some point


def test_histogram_quantiles_agree_on_every_tier_and_bracket_the_true_ttft(history) -> None:
    client, h = history
    answers = {}
    for tier in ("raw", "1m", "1h"):
        df = histogram_quantile(client, TTFT, 0.99, *h.window, by="model", tier=tier).set_index("model")
        answers[tier] = df["quantile"].to_dict()
        counts = df["count"].to_dict()
        assert counts == pytest.approx(_expected_by_model(h, f"{TTFT}_count"), rel=1e-9)
    assert answers["1m"] == pytest.approx(answers["raw"], rel=1e-9)
    assert answers["1h"] == pytest.approx(answers["raw"], rel=1e-9)
    bounds = [
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        640.0,
        2560.0,
    ]
    for model, ttfts in h.ttfts.items():
        true = float(np.quantile(ttfts, 0.99))
        # the interpolated answer lies in the bucket that holds the true quantile (or next to it:
        # requests finishing near the window edges are counted by when they were scraped)
        i = int(np.searchsorted(bounds, true))
        lower = bounds[max(i - 2, 0)]
        upper = bounds[min(i + 1, len(bounds) - 1)]
        assert lower <= answers["raw"][model] <= upper, (model, true, answers["raw"][model])


def _expected_by_model(h: History, sample: str) -> dict[str, float]:
    models = dict(REPLICAS)
    out: dict[str, float] = defaultdict(float)
    for replica, inc in _expected(h, sample).items():
        out[models[replica]] += inc
    return dict(out)


def test_weighted_request_counts_and_tokens_agree_on_every_tier(history) -> None:
    client, h = history
    rows = pd.DataFrame(h.requests)
    inside = rows[(rows["ts"] >= h.window[0]) & (rows["ts"] < h.window[1])]
    expected = inside.groupby("tenant").apply(
        lambda g: pd.Series({"requests": g["weight"].sum(), "prompt_tokens": (g["weight"] * g["prompt_tokens"]).sum()}),
        include_groups=False,
    )
    for tier in ("raw", "1m", "1h"):
        df = request_totals(client, *h.window, by=["tenant"], tier=tier).set_index("tenant")
        for tenant, row in expected.iterrows():
            assert df.loc[tenant, "requests"] == pytest.approx(row["requests"], rel=1e-6), tier
            assert df.loc[tenant, "prompt_tokens"] == pytest.approx(row["prompt_tokens"], rel=1e-6), tier
        assert df.attrs["plan"].tier.name == tier


def test_request_latency_sketch_is_within_a_stated_rank_tolerance(history) -> None:
    client, h = history
    rows = pd.DataFrame(h.requests)
    inside = rows[(rows["ts"] >= h.window[0]) & (rows["ts"] < h.window[1])]
    for tier in ("1m", "1h"):
        df = request_quantile(client, "ttft", 0.9, *h.window, by=["model"], tier=tier).set_index("model")
        for model, group in inside.groupby("model"):
            ttft = np.repeat(group["ttft_seconds"].to_numpy(), group["weight"].astype(int).to_numpy())
            answer = df.loc[model, "value"]
            # stated tolerance: the sketch's answer lies between the exact 0.85 and 0.95 quantiles
            assert np.quantile(ttft, 0.85) <= answer <= np.quantile(ttft, 0.95), (tier, model)
    raw = request_quantile(client, "ttft", 0.9, *h.window, by=["model"], tier="raw").set_index("model")
    for model, group in inside.groupby("model"):
        ttft = np.repeat(group["ttft_seconds"].to_numpy(), group["weight"].astype(int).to_numpy())
        assert math.isclose(raw.loc[model, "value"], float(np.quantile(ttft, 0.9)), rel_tol=0.02, abs_tol=1e-3)


def test_context_buckets_agree_between_raw_rows_and_rollups(history) -> None:
    client, h = history
    rows = pd.DataFrame(h.requests)
    inside = rows[(rows["ts"] >= h.window[0]) & (rows["ts"] < h.window[1])]
    buckets = pd.cut(inside["prompt_tokens"], [-1, 2047, 8191, 32767, 1 << 40], labels=["<2k", "2-8k", "8-32k", ">32k"])
    expected = inside.groupby(buckets, observed=True)["weight"].sum().to_dict()
    assert len(expected) >= 1
    for tier in ("raw", "1m", "1h"):
        df = request_totals(client, *h.window, by=["context_bucket", "model"], tier=tier)
        got = df.groupby("context_bucket")["requests"].sum().to_dict()
        assert got == pytest.approx(expected), tier


def test_several_distributions_in_one_query_and_no_replica_on_rollups(history) -> None:
    client, h = history
    rows = pd.DataFrame(h.requests)
    inside = rows[(rows["ts"] >= h.window[0]) & (rows["ts"] < h.window[1])]
    for tier in ("raw", "1h"):
        df = request_quantiles(client, ["prompt_tokens", "ttft"], [0.5, 0.9], *h.window, by=["tenant"], tier=tier)
        df = df.set_index("tenant")
        for tenant, group in inside.groupby("tenant"):
            prompts = np.repeat(group["prompt_tokens"].to_numpy(), group["weight"].astype(int).to_numpy())
            for q in (0.5, 0.9):
                lo, hi = np.quantile(prompts, max(q - 0.05, 0)), np.quantile(prompts, min(q + 0.05, 1))
                assert lo <= df.loc[tenant, f"prompt_tokens_q{q:g}"] <= hi, (tier, tenant, q)
            assert df.loc[tenant, "ttft_q0.5"] <= df.loc[tenant, "ttft_q0.9"]
    with pytest.raises(ValueError, match="rolled up without replica"):
        request_totals(client, *h.window, by=["replica"], tier="1h")
    per_replica = request_totals(client, *h.window, by=["replica"], tier="raw")
    assert set(per_replica["replica"]) == {r for r, _ in REPLICAS}


def test_an_unmarked_restart_never_gives_a_negative_increase(ch) -> None:
    clickhouse_runner.apply(ch)
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    # the collector was away while the engine restarted: 500 -> 40 with no reset mark (inserted
    # where the collector inserts: the ingest table stores the samples and rolls them up)
    ch.insert_df(
        "samples_ingest",
        pd.DataFrame(
            {
                "metric": ["vllm:prompt_tokens_total"] * 4,
                "fingerprint": [7] * 4,
                "ts": [
                    start,
                    start + timedelta(minutes=1),
                    start + timedelta(minutes=30),
                    start + timedelta(minutes=31),
                ],
                "value": [400.0, 500.0, 40.0, 70.0],
                "reset": [0.0] * 4,
                # as a collector that restarted without the series' last value counts them: nothing
                # for the first sample it sees after the gap, then its increases
                "increase": [0.0, 100.0, 0.0, 30.0],
            }
        ),
    )
    ch.insert_df(
        "series",
        pd.DataFrame(
            {
                "fingerprint": [7],
                "metric": ["vllm:prompt_tokens_total"],
                "original_metric": ["vllm:prompt_tokens_total"],
                "labels": [{"replica": "r"}],
                "first_seen": [start],
                "last_seen": [start],
            }
        ),
    )
    for tier in ("raw", "1m", "1h"):
        df = counter_increase(
            ch,
            "vllm:prompt_tokens_total",
            start - timedelta(minutes=1) if tier != "1h" else start,
            start + timedelta(hours=1),
            tier=tier,
        )
        # the raw values: from zero to 70 after the restart (the 100 before it is lost); the rollups sum
        # the collector's increases: 100 before the gap and 30 after it (the 40 in it is lost)
        assert df["increase"].tolist() == ([70.0] if tier == "raw" else [130.0]), tier


def test_the_6_hour_tier_answers_as_the_1_hour_tier_it_is_fed_from(history) -> None:
    """samples_6h is filled from samples_1h (a cascade of views): over whole 6-hour buckets it
    gives the 1-hour tier's counter increases, gauge summaries and histogram quantiles."""
    from analytics.tiers import align

    client, h = history
    start, end = align(h.start, h.end, timedelta(hours=6))
    for metric in ("vllm:generation_tokens_total", f"{TTFT}_count"):
        six = counter_increase(client, metric, start, end, by="replica", tier="6h")
        assert six.attrs["plan"].tier.name == "6h" and len(six) == len(h.kv) > 1
        hour = counter_increase(client, metric, start, end, by="replica", tier="1h")
        assert _by_replica(six, "increase") == pytest.approx(_by_replica(hour, "increase"), rel=1e-9)
    six = gauge_summary(client, "vllm:kv_cache_usage_perc", start, end, by="replica", tier="6h").set_index("replica")
    hour = gauge_summary(client, "vllm:kv_cache_usage_perc", start, end, by="replica", tier="1h").set_index("replica")
    assert six.to_numpy() == pytest.approx(hour.to_numpy(), rel=1e-9)
    six = histogram_quantile(client, TTFT, 0.99, start, end, by="model", tier="6h").set_index("model")
    hour = histogram_quantile(client, TTFT, 0.99, start, end, by="model", tier="1h").set_index("model")
    assert len(six) and six.to_numpy() == pytest.approx(hour.to_numpy(), rel=1e-9)
