#!/usr/bin/env bash
# The demo `make demo` runs until `fleetscope up` arrives: migrate the embedded stores, start the
# bundled fleet of real vLLM engines and the collector, send a minute of steady traffic, stop
# everything (also on Ctrl-C), and show what landed in ClickHouse.
set -uo pipefail
BIN=${BIN:-.venv/bin}
"$BIN/fleetscope" migrate || exit $?
collector=""
cleanup() {
  if [ -n "$collector" ]; then kill -INT "$collector" 2>/dev/null; wait "$collector"; fi
  "$BIN/fleetscope" fleet down
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"$BIN/fleetscope" fleet up --detach || exit $?
"$BIN/fleetscope" collect --no-migrate &
collector=$!
"$BIN/fleetscope" fleet traffic --scenario steady --duration "${DEMO_SECONDS:-60}"
sleep 6  # a last scrape and the engines' span export
kill -INT "$collector"; wait "$collector"; collector=""
"$BIN/python" - <<'PY'
import clickhouse_connect
from fleetscope.settings import load_settings
from storage.clickhouse import parse_url

client = clickhouse_connect.get_client(dsn=f"chdb://{parse_url(load_settings().clickhouse.url).path}")
print("in ClickHouse now:")
for table in ("scrapes", "series", "samples", "requests"):
    print(f"  {table:<9} {client.query(f'SELECT count() FROM {table}').result_rows[0][0]:>10,} rows")
rows = client.query("""
    SELECT replica, count() AS requests, countIf(has_gateway AND has_engine) AS joined,
           round(quantileIf(0.99)(ttft_seconds, has_engine), 3) AS p99_ttft_s
    FROM requests_joined GROUP BY replica ORDER BY replica""").result_rows
for replica, n, joined, p99 in rows:
    print(f"  {replica:<9} {n:>6} requests ({joined} gateway log + engine span joined), p99 TTFT {p99} s")

# the numbers the dashboard and alert rules share (analytics/, docs/analytics.md)
from datetime import UTC, datetime, timedelta

from analytics.cost import cost_per_token
from analytics.metrics import histogram_quantile
from analytics.saturation import saturation
from storage.catalog import gpu_prices
from storage.metadata import make_engine, make_sessionmaker

settings = load_settings()
end = datetime.now(UTC)
start = end - timedelta(minutes=10)
p99 = histogram_quantile(client, "vllm:time_to_first_token_seconds", 0.99, start, end, "model")
print("last 10 minutes, from analytics/:")
for row in p99.itertuples():
    print(f"  {row.model:<11} p99 TTFT {row.quantile:.3f} s (engine histograms, {row.count:.0f} requests)")
for row in saturation(client, start, end, "replica").itertuples():
    print(f"  {row.replica:<11} KV cache avg {row.kv_avg:.0%} max {row.kv_max:.0%}, prefix-cache hits {row.prefix_hit_rate:.0%}")
prices = gpu_prices(make_sessionmaker(make_engine(settings.metadata.url)))
fleet = cost_per_token(client, start, end, prices, weights=settings.cost.weights()).set_index("model").loc["(fleet)"]
print(f"  fleet spend ${fleet['spend']:.4f} ({fleet['idle_share']:.0%} idle), ${fleet['cost_per_million_tokens']:.2f} per 1M tokens")
PY
