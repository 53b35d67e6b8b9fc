"""Acceptance: a real Prometheus scrapes fleetscope's numbers from the collector's own /metrics,
and ``promtool query instant`` returns a model's cost per 1M tokens equal to analytics' figure on
the same data over the same window.

The collector is the real one, built by ``fleetscope.collect.build_collector`` (the wiring
``fleetscope collect`` and ``fleetscope up`` use) and serving HTTP on a free port; its exporter
reads the seeded ``engine-stall`` store in the background every 5 s, on the wall clock. The
refresh time comes back through Prometheus in the same query as the cost (one scrape, one
snapshot), and analytics' ``cost_per_token`` is then asked over the hour before it.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from analytics.cost import cost_per_token
from exporter.read import Stores
from fleetscope.collect import build_collector
from fleetscope.settings import Settings
from storage.catalog import gpu_prices
from tests.conftest import stop_loop
from tests.promtools import binary, free_port, started

LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*|)\{(?P<labels>.*)\} => (?P<value>\S+) @\[(?P<ts>[0-9.]+)\]$")
MODEL = "tiny-small"


@contextmanager
def running(collector):
    """The collector on an asyncio loop in a thread, as ``fleetscope up`` runs it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="collector", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(collector.start(), loop).result(timeout=60)
    try:
        yield
    finally:
        try:
            assert asyncio.run_coroutine_threadsafe(collector.stop(), loop).result(timeout=120)
        finally:
            stop_loop(loop, thread, 10)


def query(prometheus_url: str, expr: str) -> dict[str, tuple[dict[str, str], float]]:
    """``promtool query instant``: metric name ("" for an aggregate) -> (labels, value) of each series."""
    done = subprocess.run(
        [binary("promtool"), "query", "instant", prometheus_url, expr],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = {}
    for line in filter(None, map(str.strip, done.stdout.splitlines())):
        found = LINE.match(line)
        assert found, f"promtool printed {line!r}"
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found["labels"]))
        out[found["name"]] = (labels, float(found["value"]))
    return out


def prometheus_config(path: Path, target: str) -> Path:
    path.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: fleetscope\n"
        "    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    return path


def test_prometheus_scrapes_a_models_cost_per_million_tokens_equal_to_analytics(stall, sessions, tmp_path) -> None:
    port = free_port()
    settings = Settings.model_validate(
        {
            "data_dir": str(tmp_path / "data"),
            "collector": {"otlp_http_port": port, "otlp_grpc_port": 0, "fleet_targets": False},
            "exporter": {"interval_s": "5s"},
        }
    )
    collector = build_collector(settings, stall.client, exporter_stores=lambda: Stores(stall.client, sessions))
    web = free_port()
    args = [
        f"--config.file={prometheus_config(tmp_path / 'prometheus.yml', f'127.0.0.1:{port}')}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web}",
    ]
    with running(collector), started("prometheus", args, tmp_path / "prometheus", port=web) as prometheus:
        cost = f'fleetscope_model_cost_usd_per_million_tokens{{model="{MODEL}"}}'
        both = f'{cost} or fleetscope_exporter_last_refresh_timestamp_seconds{{job="fleetscope"}}'
        deadline = time.monotonic() + 120
        while len(answer := query(prometheus.url, both)) < 2:
            assert time.monotonic() < deadline, f"Prometheus has no {cost} yet:\n{prometheus.log_text()}"
            time.sleep(0.5)
        own = query(prometheus.url, 'count({job="fleetscope", __name__=~"fleetscope_collector_.+"})')
        errors = query(prometheus.url, 'sum(fleetscope_exporter_refresh_errors_total{job="fleetscope"})')
        up = query(prometheus.url, 'up{job="fleetscope"}')
    labels, value = answer["fleetscope_model_cost_usd_per_million_tokens"]
    assert (labels["model"], labels["job"]) == (MODEL, "fleetscope")
    at = datetime.fromtimestamp(answer["fleetscope_exporter_last_refresh_timestamp_seconds"][1], UTC)
    assert stall.end <= at  # the refresher reads as of now, after the seeded run
    want = cost_per_token(stall.client, at - timedelta(hours=1), at, gpu_prices(sessions), now=at)
    figure = float(want.loc[want["model"] == MODEL, "cost_per_million_tokens"].iloc[0])
    assert figure > 0
    assert value == figure  # exactly: Prometheus keeps the float64 the exporter wrote
    assert up["up"][1] == 1.0
    assert own[""][1] > 0  # the collector's own metrics, from the same endpoint
    assert errors[""][1] == 0.0
