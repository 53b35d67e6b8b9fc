"""Cost on a hand-computed example: two replicas, two tenants, idle time and an engine restart
(a counter reset), priced from the metadata DB. Every expected figure is worked out by hand in
the comments, to the cent.

The fleet, over the 2-hour window [T0, T0 + 2 h), scraped every 15 s:
- replica a: H100 ($2.00 per GPU-hour), 1 GPU, model m-a; scraped from a minute before the
  window to its end, so it is up the whole 2 h (each minute from the scrape before its first to
  its own last one), busy (requests running) for the first 90 minutes, idle the last 30. Its
  counters reach 900k prompt tokens (100k of them cached) and 200k output tokens by minute 90.
- replica b: L4 ($0.80), 2 GPUs, model m-b; first scraped at 59:45, so up from then to the end:
  minutes 60-119 of the window (its first scrape, alone in minute 59, is an instant), busy
  minutes 60-99, idle 100-119. It served 300k prompt / 60k output tokens, restarted at minute 90
  (its counters fell to 0: a reset), then served 100k prompt / 40k output more.
- request log (gateway): acme one row of weight 2 (1,000 prompt, 200 output tokens) on m-a in
  every minute 0-89; globex one row of weight 4 (500 prompt of which 100 cached, 500 output) on
  m-a in minutes 0-29 and on m-b in minutes 60-89.
The samples go through the collector's parser and converter, which mark the counter reset.
The rule (analytics.allocation): each minute's spend of a pool is shared among the requests the
log holds for it in that minute, by weighted tokens; a minute nobody used is unattributed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from analytics.cost import (
    ReferencePrice,
    TokenWeights,
    compare_reference,
    cost_by_tenant,
    cost_per_token,
    cost_views,
    gpu_spend,
)
from analytics.cost_series import cost_over_time
from analytics.filters import Filters
from collector.convert import Batch, SeriesConverter
from collector.exposition import parse
from collector.scrape import ScrapeResult
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner, metadata_runner
from storage.catalog import gpu_prices, set_gpu_price
from storage.chdb_http import ChdbHttpServer
from storage.clickhouse import connect
from storage.metadata import make_engine, make_sessionmaker
from tests.analytics.agreement import disagreements, figures

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
WINDOW = (T0, T0 + timedelta(hours=2))


def exposition(model: str, running: float, prompt: float, cached: float, output: float) -> str:
    labels = f'{{model_name="{model}"}}'
    return "".join(
        f"# TYPE {name} {kind}\n{name}{labels} {value}\n"
        for name, kind, value in (
            ("vllm:num_requests_running", "gauge", running),
            ("vllm:prompt_tokens_total", "counter", prompt),
            ("vllm:prompt_tokens_cached_total", "counter", cached),
            ("vllm:generation_tokens_total", "counter", output),
        )
    )


def replica_a(minute: float) -> str:
    done = max(0.0, min(minute, 90)) / 90
    return exposition("m-a", 3 if minute < 90 else 0, 900_000 * done, 100_000 * done, 200_000 * done)


def replica_b(minute: float) -> str:
    if minute < 90:  # first engine: its tokens counted from minute 75
        prompt, output = (300_000, 60_000) if minute >= 75 else (0, 0)
    else:  # restarted at minute 90: counters from zero again
        prompt, output = (100_000, 40_000) if minute >= 95 else (0, 0)
    return exposition("m-b", 2 if minute < 100 else 0, prompt, 0, output)


def fleet(ch, spool: Path) -> None:
    clickhouse_runner.apply(ch)
    writer = Writer(ch, WriterConfig(spool_dir=spool))
    plan = [("a", "H100", "1", -1, replica_a), ("b", "L4", "2", 59.75, replica_b)]
    for name, gpu, count, first, render in plan:
        target = make_target(
            f"10.0.0.{ord(name)}:8000",
            job="vllm",
            interval_s=15,
            timeout_s=5,
            labels={"replica": name, "model": f"m-{name}", "gpu_type": gpu, "gpu_count": count},
        )
        converter, batch = SeriesConverter(), Batch()
        for i in range(int(first * 4), 120 * 4 + 1):  # a scrape every 15 s, the last at the window's end
            minute = i / 4
            text = render(minute)
            converter.convert(
                ScrapeResult(
                    target,
                    (T0 + timedelta(minutes=minute)).timestamp(),
                    True,
                    0.01,
                    len(text.splitlines()) // 2,
                    "",
                    parse(text),
                ),
                batch,
            )
        writer.add_tables(batch.tables)
    assert writer.flush()
    rows = []
    for tenant, minutes, model, weight, prompt, cached, output in (
        ("acme", range(90), "m-a", 2.0, 1000, 0, 200),
        ("globex", range(30), "m-a", 4.0, 500, 100, 500),
        ("globex", range(60, 90), "m-b", 4.0, 500, 100, 500),
    ):
        rows += [
            {
                "ts": T0 + timedelta(minutes=i, seconds=20),
                "source": "gateway",
                "request_id": f"{tenant}-{model}-{i}",
                "tenant": tenant,
                "model": model,
                "route": "pinned",
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "completion_tokens": output,
                "weight": weight,
            }
            for i in minutes
        ]
    ch.insert_df("requests", pd.DataFrame(rows))


@pytest.fixture
def prices(sqlite_url: str) -> dict[str, float]:
    metadata_runner.upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    sessions = make_sessionmaker(engine)
    set_gpu_price(sessions, "H100", 2.00)  # our contract, over the seeded list price
    set_gpu_price(sessions, "L4", 0.80)
    found = gpu_prices(sessions)
    engine.dispose()
    return found


@pytest.mark.parametrize("tier", ["raw", "1m"])
def test_spend_counts_uptime_gpus_price_and_idle(ch, prices, tier, tmp_path) -> None:
    fleet(ch, tmp_path)
    df = gpu_spend(ch, *WINDOW, prices, tier=tier).set_index("replica")
    # a: 2 h x 1 GPU x $2.00 = $4.00, of which idle 0.5 h x $2.00 = $1.00
    assert round(df.loc["a", "spend"], 2) == 4.00 and round(df.loc["a", "idle_spend"], 2) == 1.00
    # b: 1 h x 2 GPUs x $0.80 = $1.60, of which idle 20 min x 2 x $0.80 = $0.53
    assert round(df.loc["b", "spend"], 2) == 1.60 and round(df.loc["b", "idle_spend"], 2) == 0.53
    assert (df.loc["b", "up_seconds"], df.loc["b", "busy_seconds"]) == (3600, 2400)


def test_cost_per_million_tokens_counts_across_the_restart(ch, prices, tmp_path) -> None:
    fleet(ch, tmp_path)
    df = cost_per_token(ch, *WINDOW, prices, tier="raw").set_index("model")
    # b's tokens across its restart: 300k + 100k prompt, 60k + 40k output
    assert (df.loc["m-b", "prompt_tokens"], df.loc["m-b", "completion_tokens"]) == (400_000, 100_000)
    fleet_row = df.loc["(fleet)"]
    assert round(fleet_row["spend"], 2) == 5.60 and round(fleet_row["idle_spend"], 2) == 1.53
    # $5.60 / (1.3M prompt + 0.3M output) x 1M = $3.50; m-a $4.00 / 1.1M = $3.64; m-b $1.60 / 0.5M = $3.20
    assert round(fleet_row["cost_per_million_tokens"], 2) == 3.50
    assert round(df.loc["m-a", "cost_per_million_tokens"], 2) == 3.64
    assert round(df.loc["m-b", "cost_per_million_tokens"], 2) == 3.20
    # weights 1 : 0.25 : 4 -> 1.2M computed + 0.1M x 0.25 cached + 0.3M x 4 output = 2.425M weighted tokens;
    # $5.60 / 2.425M x 1M = $2.31 per 1M input, $0.58 cached, $9.24 output
    assert [round(fleet_row[c], 2) for c in ("input_per_million", "cached_per_million", "output_per_million")] == [
        2.31,
        0.58,
        9.24,
    ]
    assert round(fleet_row["idle_share"], 3) == round(1.5333 / 5.60, 3)
    # the same tokens at $0.15 / $0.075 / $0.60 per 1M: 1.2M x 0.15 + 0.1M x 0.075 + 0.3M x 0.60 = $0.3675
    ref = compare_reference(fleet_row, [ReferencePrice("api-mini", input=0.15, output=0.60, cached=0.075)]).iloc[0]
    assert round(ref["reference_cost"], 4) == 0.3675 and round(ref["ratio"], 2) == round(5.60 / 0.3675, 2)


def test_showback_shares_each_pool_minute_by_minute_by_weighted_tokens(ch, prices, tmp_path) -> None:
    fleet(ch, tmp_path)
    weights = TokenWeights(input=1, cached=0.25, output=4)
    df = cost_by_tenant(ch, *WINDOW, prices, weights=weights, tier="raw").set_index("tenant")
    # weighted tokens per row: acme 2 x (1,000 + 200 x 4) = 3,600; globex 4 x (400 + 100 x 0.25 + 500 x 4) = 9,700
    # m-a costs $2.00 / 60 = $0.0333 a minute, busy minutes 0-89, idle 90-119:
    #   minutes 0-29, both: acme 3,600 / 13,300 = 0.2707 of it, globex 0.7293 -> 30 x 0.0333 = $1.00 shared:
    #   acme $0.2707, globex $0.7293; minutes 30-89, acme alone: 60 x 0.0333 = $2.00; minutes 90-119: nobody
    # m-b costs $0.80 x 2 / 60 = $0.0267 a minute: minutes 60-89 globex alone ($0.80); 90-99 busy and 100-119
    #   idle with nobody ($0.27 + $0.53)
    assert round(df.loc["acme", "direct"], 2) == 2.27 and round(df.loc["acme", "idle"], 2) == 0.00
    assert round(df.loc["globex", "direct"], 2) == 1.53 and round(df.loc["globex", "idle"], 2) == 0.00
    # nobody's: m-a's idle half hour ($1.00) and m-b's last 30 minutes ($0.27 busy + $0.53 idle)
    assert round(df.loc["(unattributed)", "direct"], 2) == 0.27 and round(df.loc["(unattributed)", "idle"], 2) == 1.53
    assert round(df["spend"].sum(), 2) == 5.60
    # acme billed 90 x 2 x 1,200 = 216,000 tokens: $2.2707 / 216,000 x 1M = $10.51;
    # globex 60 x 4 x 1,000 = 240,000: $1.5293 / 240,000 x 1M = $6.37
    assert round(df.loc["acme", "cost_per_million_tokens"], 2) == 10.51
    assert round(df.loc["globex", "cost_per_million_tokens"], 2) == 6.37
    separate = cost_by_tenant(ch, *WINDOW, prices, weights=weights, idle="separate", tier="raw").set_index("tenant")
    assert round(separate.loc["acme", "spend"], 2) == 2.27 and round(separate.loc["globex", "spend"], 2) == 1.53
    # every idle minute on its own row ($1.00 + $0.53), the busy minutes nobody used unattributed
    assert round(separate.loc["(idle)", "spend"], 2) == 1.53
    assert round(separate.loc["(unattributed)", "spend"], 2) == 0.27
    # a tenant's cost does not depend on the filter that picks it
    only = cost_by_tenant(ch, *WINDOW, prices, weights=weights, tier="raw", filters=Filters(tenant="acme"))
    assert list(only["tenant"]) == ["acme"] and round(only["spend"].iloc[0], 2) == 2.27
    # nor on the window it is read over: its two hours are the sum of its two single hours
    hours = [
        cost_by_tenant(ch, T0 + timedelta(hours=h), T0 + timedelta(hours=h + 1), prices, weights=weights, tier="raw")
        .set_index("tenant")
        .loc["acme", "spend"]
        for h in (0, 1)
    ]
    assert sum(hours) == pytest.approx(df.loc["acme", "spend"], rel=1e-9)


def test_the_cost_page_reads_the_same_figures_at_once(ch, prices, tmp_path) -> None:
    fleet(ch, tmp_path)
    weights = TokenWeights(input=1, cached=0.25, output=4)
    for filters in (None, Filters(tenant="acme"), Filters(model="m-b")):
        views = cost_views(ch, *WINDOW, prices, weights=weights, tier="raw", filters=filters)
        # the page's three tables, each the figures of its own function (hand-checked above)
        pd.testing.assert_frame_equal(views.spend, gpu_spend(ch, *WINDOW, prices, tier="raw", filters=filters))
        per_model = cost_per_token(ch, *WINDOW, prices, weights=weights, tier="raw", filters=filters)
        pd.testing.assert_frame_equal(views.per_model, per_model)
        tenants = cost_by_tenant(ch, *WINDOW, prices, weights=weights, tier="raw", filters=filters)
        pd.testing.assert_frame_equal(views.tenants, tenants)
    everything = cost_views(ch, *WINDOW, prices, weights=weights, tier="raw")
    assert round(everything.per_model.set_index("model").loc["(fleet)", "spend"], 2) == 5.60
    assert round(everything.tenants.set_index("tenant").loc["acme", "spend"], 2) == 2.27


def test_spend_without_request_rows_is_unattributed(ch, prices, tmp_path) -> None:
    fleet(ch, tmp_path)
    ch.command("ALTER TABLE requests DELETE WHERE model = 'm-b' SETTINGS mutations_sync = 1")
    df = cost_by_tenant(ch, *WINDOW, prices, tier="raw").set_index("tenant")
    # all of b's pool ($1.60), which no logged request used now, and m-a's idle half hour ($1.00)
    assert round(df.loc["(unattributed)", "spend"], 2) == 2.60
    assert round(df["spend"].sum(), 2) == 5.60


@pytest.mark.parametrize("tier", ["raw", "1h"])
def test_the_showback_reads_the_gateways_log_and_the_spans_only_without_it(ch, prices, tmp_path, tier) -> None:
    fleet(ch, tmp_path)
    gateway_only = cost_by_tenant(ch, *WINDOW, prices, tier=tier)
    # the engines' spans of the same requests: no tenant or route (an engine does not know them)
    spans = ch.query_df("SELECT * FROM requests")
    ch.insert_df("requests", spans.assign(source="otlp", tenant="", route="", request_id=spans["request_id"] + "-s"))
    both = cost_by_tenant(ch, *WINDOW, prices, tier=tier)
    # the gateway's rows, counted once: acme 90 rows of weight 2, globex 60 of weight 4; the spans add nothing
    pd.testing.assert_frame_equal(both, gateway_only)
    df = both.set_index("tenant")
    assert (df.loc["acme", "requests"], df.loc["globex", "requests"]) == (180, 240) and "" not in df.index
    ch.command("ALTER TABLE requests DELETE WHERE source = 'gateway' SETTINGS mutations_sync = 1")
    for table in ("requests_1m", "requests_1h"):  # the rollups as if the gateway had never logged
        ch.command(f"ALTER TABLE {table} DELETE WHERE source = 'gateway' SETTINGS mutations_sync = 1")
    spans_only = cost_by_tenant(ch, *WINDOW, prices, tier=tier).set_index("tenant")
    # no gateway: the spans pay, as one unnamed tenant, what the gateway's tenants paid together
    assert spans_only.loc["", "requests"] == 420
    assert round(spans_only.loc["", "spend"], 2) == round(df.loc["acme", "spend"] + df.loc["globex", "spend"], 2)
    assert spans_only.attrs["source"] == "otlp" and df.attrs["source"] == "gateway"


@pytest.mark.parametrize("tier", ["1h", "6h"])
def test_the_hourly_tiers_agree_on_the_total(ch, prices, tmp_path, tier) -> None:
    fleet(ch, tmp_path)
    df = cost_per_token(ch, *WINDOW, prices, tier=tier).set_index("model")
    # the 6-hour tier's tokens; its uptime is counted in hours (6-hour buckets would count 6 h per replica)
    assert round(df.loc["(fleet)", "spend"], 2) == 5.60
    assert (df.loc["m-b", "prompt_tokens"], df.loc["m-b", "completion_tokens"]) == (400_000, 100_000)


def test_filters_and_missing_prices(ch, prices, tmp_path) -> None:
    fleet(ch, tmp_path)
    only_b = gpu_spend(ch, *WINDOW, prices, tier="raw", filters=Filters(model="m-b"))
    assert list(only_b["replica"]) == ["b"]
    with pytest.raises(KeyError, match="no GPU price for 'L4'"):
        gpu_spend(ch, *WINDOW, {"H100": 2.0}, tier="raw")
    with pytest.raises(ValueError, match="token weights"):
        TokenWeights(input=-1)


def test_seeded_prices_are_there_to_edit(prices) -> None:
    assert {"H100", "A100-80GB", "L4", "cpu-demo"} <= set(prices)
    assert prices["H100"] == 2.00  # edited by the fixture, over the seed


@pytest.mark.parametrize("tier", ["raw", "1m"])
def test_a_replica_that_starts_and_stops_mid_step_costs_the_same_per_token_in_every_step(
    ch, prices, tmp_path, tier
) -> None:
    # one H100 ($2.00/h) at a steady 1,000 prompt tokens/s, scraped every 15 s from T0 + 40 s to
    # T0 + 9 min 25 s: its first and last minute-steps are partial, and its first scrape's tokens
    # are unknown (no sample before it), so those steps' spend must cover only what their tokens do
    clickhouse_runner.apply(ch)
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path))
    target = make_target(
        "10.0.0.9:8000",
        job="vllm",
        interval_s=15,
        timeout_s=5,
        labels={"replica": "s", "model": "m-s", "gpu_type": "H100", "gpu_count": "1"},
    )
    converter, batch = SeriesConverter(), Batch()
    for t in range(40, 9 * 60 + 26, 15):
        text = exposition("m-s", 1, 1000 * t, 0, 0)
        converter.convert(
            ScrapeResult(target, (T0 + timedelta(seconds=t)).timestamp(), True, 0.01, 4, "", parse(text)), batch
        )
    writer.add_tables(batch.tables)
    assert writer.flush()
    steps = cost_over_time(ch, T0, T0 + timedelta(minutes=15), prices, step=60, tier=tier).dropna(
        subset=["cost_per_million_tokens"]
    )
    assert len(steps) == 10  # minutes 0 to 9, the partial first and last included
    # $2.00 / 3600 s / 1,000 tokens/s = $0.5556 per 1M tokens, whatever part of the step was up
    assert steps["cost_per_million_tokens"].to_numpy() == pytest.approx(2.00 / 3600 / 1000 * 1e6, rel=1e-9)
    # the spend is the time between the first and the last scrape: 8 min 45 s
    assert steps["spend"].sum() == pytest.approx(2.00 * 525 / 3600, rel=1e-9)


@pytest.mark.parametrize("weights", [TokenWeights(), TokenWeights(input=1, cached=0.1, output=8)])
def test_showback_series_and_explain_read_one_number(ch, prices, tmp_path, weights) -> None:
    """The fleet, each pool and each tenant over the hour before and after minute 60 (and the half
    hour either side of minute 80 for m-b, which served from minute 75): the showback, the series'
    mean over the same steps and explain's before / after agree, whatever the token weights."""
    fleet(ch, tmp_path)
    views = [None, Filters(model="m-a"), Filters(tenant="acme"), Filters(tenant="globex")]
    rows = figures(ch, WINDOW, prices, views, at=T0 + timedelta(minutes=60), step=60, weights=weights)
    rows += figures(ch, WINDOW, prices, [Filters(model="m-b")], at=T0 + timedelta(minutes=80), step=60, weights=weights)
    assert len(rows) == 10 and not disagreements(rows), pd.DataFrame(rows).to_string()
    by_view = {(r["view"], r["period"]): r["explain"] for r in rows}
    # acme before minute 60: its share of m-a's $1.00 in minutes 0-29 (at 1 : 0.25 : 4, 3,600 / 13,300), the
    # whole $1.00 of minutes 30-59; 60 rows x 2 x 1,200 = 144,000 tokens
    acme = 2 * (1000 * weights.input + 200 * weights.output)
    globex = 4 * (400 * weights.input + 100 * weights.cached + 500 * weights.output)
    expected = (acme / (acme + globex) + 1.00) / 144_000 * 1e6
    assert by_view[("tenant acme", "before")] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("tier", ["raw", "1h"])
def test_a_clickhouse_server_reads_the_same_spend_and_showback(
    ch, ch_database, chdb_dir, prices, tmp_path, tier
) -> None:
    """A dashboard in its own process (or on a ClickHouse server) reads over ClickHouse's HTTP
    interface, where the uptime's buckets and the request log come as Arrow: the same frames as
    in-process, with the figures worked out above."""
    fleet(ch, tmp_path)
    server = ChdbHttpServer(chdb_dir).start()
    try:
        remote = connect(f"{server.url}/{ch_database}")
        reads = {
            "spend": lambda c: gpu_spend(c, *WINDOW, prices, tier=tier),
            "showback": lambda c: cost_by_tenant(c, *WINDOW, prices, tier=tier),
            "m-b's showback": lambda c: cost_by_tenant(c, *WINDOW, prices, tier=tier, filters=Filters(model="m-b")),
        }
        answers = {name: (read(remote), read(ch)) for name, read in reads.items()}
        remote.close()
    finally:
        server.stop()
    for name, (over_http, in_process) in answers.items():
        pd.testing.assert_frame_equal(over_http, in_process, obj=name)
    assert round(answers["spend"][0]["spend"].sum(), 2) == 5.60
    if tier == "raw":  # shared minute by minute, as above (the hourly tier shares each hour's spend)
        assert round(answers["showback"][0].set_index("tenant").loc["acme", "spend"], 2) == 2.27
    # m-b's pool alone: $1.60, of it globex's minutes 60-89 ($0.80) and the rest nobody's
    only_b = answers["m-b's showback"][0].set_index("tenant")
    assert round(only_b["spend"].sum(), 2) == 1.60


def test_samples_whose_series_row_is_missing_cost_nothing_and_break_nothing(ch, prices, tmp_path) -> None:
    """Samples can reach the store before their series' row (or without it, if that insert was
    lost): they cannot be priced (no replica, no GPU labels), and the rest still is."""
    fleet(ch, tmp_path)
    ch.command("ALTER TABLE series DELETE WHERE replica = 'b' SETTINGS mutations_sync = 2")
    spend = gpu_spend(ch, *WINDOW, prices, tier="raw")
    assert list(spend["replica"]) == ["a"] and round(spend["spend"].sum(), 2) == 4.00
    ch.command("TRUNCATE TABLE series")
    assert gpu_spend(ch, *WINDOW, prices, tier="1h").empty
