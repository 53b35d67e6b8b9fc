"""Gateway decisions without HTTP: model router rules, replica policies, token buckets, queue."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from fleet.gateway.admission import Admission, Rejected
from fleet.gateway.config import GatewaySpec, ModelRouterSpec, TenantLimits
from fleet.gateway.routing import NoReplica, ReplicaState, Router
from fleet.gateway.server import _prompt_info, _traceparent

ROUTER = ModelRouterSpec(
    small_model="tiny-small",
    large_model="tiny-large",
    long_prompt_tokens=1024,
    high_max_tokens=512,
    large_tenants=["bigcorp"],
)


def replicas() -> list[ReplicaState]:
    return [
        ReplicaState("small-0", "tiny-small", "u0"),
        ReplicaState("small-1", "tiny-small", "u1"),
        ReplicaState("large-0", "tiny-large", "u2"),
    ]


def router(policy: str = "least_loaded") -> Router:
    return Router(GatewaySpec(policy=policy, model_router=ROUTER), replicas())


@pytest.mark.parametrize(
    ("tenant", "prompt", "max_tokens", "model", "reason"),
    [
        ("acme", 200, 64, "tiny-small", "easy request"),
        ("acme", 1500, 64, "tiny-large", "long prompt (1500 > 1024 tokens)"),
        ("acme", 200, 800, "tiny-large", "high max_tokens (800 > 512)"),
        ("bigcorp", 10, 10, "tiny-large", "tenant rule (bigcorp)"),
    ],
)
def test_model_router_rules_and_reasons(tenant: str, prompt: int, max_tokens: int, model: str, reason: str) -> None:
    decision = router().decide("auto", tenant, prompt, max_tokens, "k")
    assert (decision.model, decision.reason) == (model, reason)
    assert decision.route.startswith("model-router:")


def test_a_named_model_is_pinned_and_an_unknown_one_refused() -> None:
    assert router().decide("tiny-large", "acme", 10, 10, "k").route == "pinned/least_loaded"
    with pytest.raises(NoReplica, match="not served"):
        router().decide("gpt-9", "acme", 10, 10, "k")


def test_least_loaded_prefers_the_idle_replica_and_alternates_on_ties() -> None:
    r = router()
    r.replicas[0].in_flight = 3
    assert {r.choose_replica("tiny-small", "k")[0].name for _ in range(4)} == {"small-1"}
    r.replicas[0].in_flight = 0
    r.replicas[1].in_flight = 0
    assert Counter(r.choose_replica("tiny-small", "k")[0].name for _ in range(10)) == {"small-0": 5, "small-1": 5}


def test_affinity_sticks_while_healthy_and_moves_only_when_its_replica_leaves() -> None:
    r = router("affinity")
    keys = [f"session-{i}" for i in range(200)]
    first = {k: r.choose_replica("tiny-small", k)[0].name for k in keys}
    assert {k: r.choose_replica("tiny-small", k)[0].name for k in keys} == first
    assert set(first.values()) == {"small-0", "small-1"}
    r.replicas[1].healthy = False
    after = {k: r.choose_replica("tiny-small", k)[0].name for k in keys}
    assert all(after[k] == "small-0" for k in keys)
    assert all(after[k] == first[k] for k in keys if first[k] == "small-0")


def test_unhealthy_replicas_are_taken_out() -> None:
    r = router("round_robin")
    r.replicas[2].healthy = False
    with pytest.raises(NoReplica, match="no healthy replica serves 'tiny-large'"):
        r.decide("auto", "acme", 2000, 10, "k")


def test_tenant_rate_limits_reject_with_retry_after() -> None:
    spec = GatewaySpec(
        tenant_limits={"acme": TenantLimits(requests_per_s=2, burst_s=1)},
        default_limits=TenantLimits(tokens_per_s=1000, burst_s=1),
    )
    admission = Admission(spec)
    admission.check_rate("acme", 10)
    admission.check_rate("acme", 10)
    with pytest.raises(Rejected, match="tenant acme over 2 requests/s") as info:
        admission.check_rate("acme", 10)
    assert info.value.retry_after_s >= 1
    admission.check_rate("globex", 900)
    with pytest.raises(Rejected, match="over 1000 tokens/s"):
        admission.check_rate("globex", 900)


def test_bounded_queue_rejects_when_full() -> None:
    async def go() -> list[str]:
        admission = Admission(GatewaySpec(max_in_flight=1, max_queue=1, queue_timeout_s=5))
        await admission.acquire()  # the one slot
        waiter = asyncio.create_task(admission.acquire())  # the one queue place
        await asyncio.sleep(0.01)
        outcomes = []
        try:
            await admission.acquire()
        except Rejected as exc:
            outcomes.append(exc.reason)
        admission.release()
        await waiter
        outcomes.append("waiter got the slot")
        return outcomes

    reason, done = asyncio.run(go())
    assert "gateway saturated: 1 requests already waiting" in reason and done == "waiter got the slot"


def test_traceparent_is_kept_or_created() -> None:
    incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert _traceparent(incoming) == ("0af7651916cd43dd8448eb211c80319c", incoming)
    trace_id, header = _traceparent("garbage")
    assert len(trace_id) == 32 and header.startswith(f"00-{trace_id}-")


def test_prompt_sizes() -> None:
    assert _prompt_info({"prompt": list(range(300))}, chat=False, prefix_tokens=4) == (300, "0,1,2,3")
    tokens, key = _prompt_info({"messages": [{"role": "user", "content": "x" * 400}]}, chat=True, prefix_tokens=4)
    assert tokens == 100 and key == "x" * 16


def test_request_log_buffers_while_the_collector_is_down_and_ships_after() -> None:
    import json

    import aiohttp
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from fleet.gateway.requestlog import RequestLogShipper

    received: list[dict] = []

    async def intake(request: web.Request) -> web.Response:
        lines = (await request.text()).splitlines()
        received.extend(json.loads(line) for line in lines if line)
        return web.json_response({"accepted": len(lines), "kept": len(lines), "rejected": []})

    async def go() -> tuple[bool, int, float, bool]:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        shipper = RequestLogShipper(
            f"http://127.0.0.1:{port}/v1/requests", 0.1, max_buffer=5, registry=CollectorRegistry()
        )
        async with aiohttp.ClientSession() as session:
            for i in range(7):
                shipper.add({"n": i})
            down = await shipper.flush(session)  # nothing listens yet
            buffered = len(shipper.buffer)
            app = web.Application()
            app.router.add_post("/v1/requests", intake)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            up = await shipper.flush(session)
            await runner.cleanup()
        return down, buffered, shipper.dropped._value.get(), up

    down, buffered, dropped, up = asyncio.run(go())
    assert not down and buffered == 5 and dropped == 2  # bounded: the two oldest were dropped, counted
    assert up and [r["n"] for r in received] == [2, 3, 4, 5, 6]


def test_a_gateway_stopping_mid_send_ships_each_record_once() -> None:
    """The periodic flush cancelled while its POST is under way (the gateway stopping), then the
    final flush: the collector gets each record once (a batch it already held is not sent again)."""
    import json
    import socket

    import aiohttp
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from fleet.gateway.requestlog import RequestLogShipper

    received: list[dict] = []
    arrived = asyncio.Event()

    async def slow_intake(request: web.Request) -> web.Response:
        lines = (await request.text()).splitlines()
        received.extend(json.loads(line) for line in lines if line)
        arrived.set()
        await asyncio.sleep(0.5)  # the answer comes after the gateway began to stop
        return web.json_response({"accepted": len(lines), "kept": len(lines), "rejected": []})

    async def go() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        app = web.Application()
        app.router.add_post("/v1/requests", slow_intake)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        shipper = RequestLogShipper(f"http://127.0.0.1:{port}/v1/requests", 0.05, 100, CollectorRegistry())
        async with aiohttp.ClientSession() as session:
            shipper.add({"n": 1})
            periodic = asyncio.create_task(shipper.run(session))
            await asyncio.wait_for(arrived.wait(), 10)
            periodic.cancel()  # what Gateway.stop does, then its final flush
            await asyncio.gather(periodic, return_exceptions=True)
            shipper.add({"n": 2})
            assert await shipper.flush(session)
        await runner.cleanup()

    asyncio.run(go())
    assert sorted(r["n"] for r in received) == [1, 2]
