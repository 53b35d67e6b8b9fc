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
PY
