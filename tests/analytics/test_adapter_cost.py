"""Showback per LoRA adapter on a hand-computed example, to the cent.

One replica ``r`` serves the base model ``base`` and two adapters, ``ad-a`` and ``ad-b``, on an
A10 at $1.50 per GPU-hour with 2 GPUs, up and busy the whole hour [T0, T0 + 1 h): spend
1 h x 2 x $1.50 = $3.00, $0.05 a minute. Its ``vllm:lora_requests_info`` series name both
adapters, so their requests are costed in the base model's pool. The request log (default
weights: a computed prompt token 1, a cached one 0.25, an output token 4):
- ad-a: a row of weight 1 every minute, 1,000 prompt tokens (none cached), 250 output:
  1,000 + 250 x 4 = 2,000 weighted tokens a minute;
- ad-b: a row of weight 2 (2 requests) in minutes 0-29, 400 prompt tokens of which 200 cached,
  100 output: 2 x (200 + 200 x 0.25 + 100 x 4) = 1,300 a minute;
- base: 2 rows of weight 1 every minute, 500 prompt, 125 output: 2 x 1,000 = 2,000 a minute.
Each minute's $0.05 is shared by that minute's weighted tokens: minutes 0-29 (5,300 in all):
ad-a 2,000 / 5,300, ad-b 1,300 / 5,300, base 2,000 / 5,300; minutes 30-59 (4,000): ad-a and base
half each. ad-a: 30 x 0.05 x 2,000 / 5,300 + 30 x 0.05 / 2 = $0.5660 + $0.75 = $1.3160; ad-b:
30 x 0.05 x 1,300 / 5,300 = $0.3679; base $1.3160. Per 1M billed tokens (prompt + output):
ad-a 1.3160 / (60 x 1,250) x 10^6 = $17.55; ad-b 0.3679 / (60 x 500) x 10^6 = $12.26.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from analytics.adapters import adapter_pools, adapter_traffic, residency
from analytics.cost import cost_by_adapter, cost_by_tenant
from analytics.cost_series import cost_over_time
from analytics.filters import Filters
from collector.convert import Batch, SeriesConverter
from collector.exposition import parse
from collector.scrape import ScrapeResult
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
WINDOW = (T0, T0 + timedelta(hours=1))
PRICES = {"A10": 1.50}


def _exposition(at: float, minute: float) -> str:
    # both adapters ran in every step; the value is when the engine last stepped in that state
    lora = 'vllm:lora_requests_info{max_lora="2",waiting_lora_adapters="",running_lora_adapters="ad-a,ad-b"}'
    return (
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="base"} 2\n'
        f"# TYPE vllm:lora_requests_info gauge\n{lora} {at}\n"
    )


@pytest.fixture
def fleet(ch, tmp_path: Path):
    clickhouse_runner.apply(ch)
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path))
    target = make_target(
        "10.0.0.1:8000",
        job="vllm",
        interval_s=15,
        timeout_s=5,
        labels={"replica": "r", "model": "base", "gpu_type": "A10", "gpu_count": "2"},
    )
    converter, batch = SeriesConverter(), Batch()
    for i in range(-1, 60 * 4):  # a scrape every 15 s for the hour, the first just before it
        ts = (T0 + timedelta(seconds=15 * i)).timestamp()
        text = _exposition(ts - 1, i / 4)
        converter.convert(ScrapeResult(target, ts, True, 0.01, 2, "", parse(text)), batch)
    writer.add_tables(batch.tables)
    assert writer.flush()
    rows = []
    for model, minutes, per_minute, weight, prompt, cached, output in (
        ("ad-a", range(60), 1, 1.0, 1000, 0, 250),
        ("ad-b", range(30), 1, 2.0, 400, 200, 100),
        ("base", range(60), 2, 1.0, 500, 0, 125),
    ):
        rows += [
            {
                "ts": T0 + timedelta(minutes=i, seconds=10 + 20 * k),
                "source": "gateway",
                "request_id": f"{model}-{i}-{k}",
                "tenant": "acme",
                "model": model,
                "replica": "r",
                "route": "pinned",
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "completion_tokens": output,
                "weight": weight,
            }
            for i in minutes
            for k in range(per_minute)
        ]
    ch.insert_df("requests", pd.DataFrame(rows))
    return ch


def test_each_adapter_pays_its_share_of_its_base_models_pool_to_the_cent(fleet) -> None:
    assert adapter_pools(fleet) == {"ad-a": "base", "ad-b": "base"}
    out = cost_by_adapter(fleet, *WINDOW, PRICES).set_index("adapter")
    assert list(out.index) == ["ad-a", "ad-b"]
    assert set(out["base"]) == {"base"}
    assert out.loc["ad-a", "requests"] == 60 and out.loc["ad-b", "requests"] == 60
    assert round(out.loc["ad-a", "spend"], 4) == 1.3160
    assert round(out.loc["ad-b", "spend"], 4) == 0.3679
    assert round(out.loc["ad-a", "cost_per_million_tokens"], 2) == 17.55
    assert round(out.loc["ad-b", "cost_per_million_tokens"], 2) == 12.26


def test_tenant_showback_counts_adapter_requests_in_the_base_pool(fleet) -> None:
    # one tenant sent everything: it pays the whole $3.00, nothing is left unattributed
    tenants = cost_by_tenant(fleet, *WINDOW, PRICES).set_index("tenant")
    assert list(tenants.index) == ["acme"]
    assert round(tenants.loc["acme", "spend"], 2) == 3.00


def test_residency_reads_the_adapters_from_the_engine_states(fleet) -> None:
    found = residency(fleet, *WINDOW).set_index("adapter")
    assert list(found.index) == ["ad-a", "ad-b"]
    assert (found["resident_share"] == 1.0).all()
    assert (found["blocked_share"] == 0.0).all()


def test_a_filter_on_an_adapter_reads_its_base_pool_and_keeps_the_adapter(fleet) -> None:
    # the engines label everything with the base model: the adapter's spend is its share of that pool
    only_a = Filters(model="ad-a")
    out = cost_by_adapter(fleet, *WINDOW, PRICES, filters=only_a)
    assert list(out["adapter"]) == ["ad-a"] and round(out["spend"].iloc[0], 4) == 1.3160
    tenants = cost_by_tenant(fleet, *WINDOW, PRICES, filters=only_a).set_index("tenant")
    assert list(tenants.index) == ["acme"] and round(tenants.loc["acme", "spend"], 4) == 1.3160
    assert list(residency(fleet, *WINDOW, filters=only_a)["adapter"]) == ["ad-a"]
    # the base model brings its adapters' requests along
    traffic = adapter_traffic(fleet, *WINDOW, ["ad-a", "ad-b"], filters=Filters(model="base")).set_index("model")
    assert list(traffic.index) == ["ad-a", "ad-b"] and list(traffic["requests"]) == [60, 60]


def test_cost_over_time_adds_up_to_the_showback_minute_by_minute(fleet) -> None:
    # the tenant's requests for ad-a, step by step, and the adapter's own line: $1.3160 over the hour,
    # $0.05 x 2,000 / 5,300 = $0.0189 a minute while ad-b was busy too, $0.025 after
    series = cost_over_time(fleet, *WINDOW, PRICES, by="tenant", step=60, filters=Filters(model="ad-a"))
    assert set(series["tenant"]) == {"acme"}
    assert round(series["spend"].sum(), 4) == 1.3160
    line = cost_over_time(fleet, *WINDOW, PRICES, by="adapter", step=60).set_index("ts")
    ad_a = line[line["adapter"] == "ad-a"]["spend"]
    assert round(ad_a.iloc[0], 4) == 0.0189 and round(ad_a.iloc[-1], 4) == 0.025
    assert round(ad_a.sum(), 4) == 1.3160 and set(line["adapter"]) == {"ad-a", "ad-b"}


def test_adapter_traffic_reads_one_request_log_not_both(fleet) -> None:
    spans = fleet.query_df("SELECT * FROM requests WHERE model = 'ad-a'")
    fleet.insert_df("requests", spans.assign(source="otlp", request_id=spans["request_id"] + "-span"))
    traffic = adapter_traffic(fleet, *WINDOW, ["ad-a"]).set_index("model")
    assert traffic.loc["ad-a", "requests"] == 60  # the gateway's log, not the gateway's and the spans' sum
