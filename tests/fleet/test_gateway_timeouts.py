"""The gateway gives up on an upstream that stops answering: a simulated replica frozen by its
test hook (``POST /sim/stall``) accepts requests and never answers. The gateway answers 504 within
its first-byte timeout, frees the slot (one slot here: the next request gets through), ends a
stream that fell silent with an error event, and every request-log row says why, in a form the
collector's own parser accepts."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
from aiohttp import web

from collector.requestlog import parse_request_log
from fleet.gateway.config import GatewaySpec
from fleet.gateway.routing import ReplicaState
from fleet.gateway.server import Gateway
from fleet.sim.engine import EngineConfig
from fleet.sim.server import SimFleet, SimReplica

FIRST_BYTE_S = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def completion(max_tokens: int = 8, stream: bool = False) -> dict[str, Any]:
    return {"model": "tiny-small", "prompt": "hello " * 20, "max_tokens": max_tokens, "stream": stream}


async def scenario(config: EngineConfig, total_s: float, body: Any) -> tuple[Any, list[dict]]:
    """A simulated replica, a request-log intake and a one-slot gateway; ``body(client, gw_url,
    sim_url)`` runs against them; returns its result and the request-log rows received."""
    received: list[str] = []

    async def intake(request: web.Request) -> web.Response:
        lines = [line for line in (await request.text()).splitlines() if line]
        received.extend(lines)
        return web.json_response({"accepted": len(lines), "kept": len(lines), "rejected": []})

    app = web.Application()
    app.router.add_post("/v1/requests", intake)
    runner = web.AppRunner(app)
    await runner.setup()
    log_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", log_port).start()
    replica = SimReplica("sim-0", "tiny-small", free_port(), config)
    fleet = SimFleet([replica])
    await fleet.start()
    spec = GatewaySpec(
        port=free_port(),
        max_in_flight=1,
        max_queue=4,
        queue_timeout_s=5,
        upstream_first_byte_timeout_s=FIRST_BYTE_S,
        upstream_timeout_s=total_s,
        request_log_url=f"http://127.0.0.1:{log_port}/v1/requests",
        request_log_flush_s=0.1,
    )
    sim_url = f"http://127.0.0.1:{replica.port}"
    gateway = Gateway(spec, [ReplicaState("sim-0", "tiny-small", sim_url)])
    await gateway.start("127.0.0.1", spec.port)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            result = await body(client, f"http://127.0.0.1:{spec.port}", sim_url)
    finally:
        await gateway.stop()
        await fleet.stop()
        await runner.cleanup()
    rows, errors = parse_request_log("\n".join(received))
    assert errors == []
    return result, rows


def test_a_frozen_upstream_gets_504_within_the_first_byte_timeout_and_frees_the_slot() -> None:
    async def body(client: httpx.AsyncClient, gw: str, sim: str) -> tuple:
        (await client.post(f"{sim}/sim/stall", json={"stalled": True})).raise_for_status()
        t0 = time.monotonic()
        frozen = await client.post(f"{gw}/v1/completions", json=completion())
        waited = time.monotonic() - t0
        (await client.post(f"{sim}/sim/stall", json={"stalled": False})).raise_for_status()
        after = await client.post(f"{gw}/v1/completions", json=completion())  # the only slot is free again
        return frozen, waited, after

    (frozen, waited, after), rows = asyncio.run(scenario(EngineConfig(max_model_len=2048), 30.0, body))
    assert frozen.status_code == 504
    assert "sent no byte within 1 s" in frozen.json()["error"]["message"]
    assert FIRST_BYTE_S <= waited < FIRST_BYTE_S + 2  # not the 30 s whole-answer limit
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 8
    timed_out = [r for r in rows if r["outcome"] == "timeout"]
    assert len(timed_out) == 1 and timed_out[0]["status_code"] == 504 and timed_out[0]["replica"] == "sim-0"
    assert "replica sim-0 sent no byte within 1 s (upstream first-byte timeout" in timed_out[0]["error"]
    assert [r["outcome"] for r in rows if r is not timed_out[0]] == ["ok"] and rows[-1]["error"] == ""


def test_a_stream_that_falls_silent_ends_with_an_error_event_and_a_logged_reason() -> None:
    async def body(client: httpx.AsyncClient, gw: str, sim: str) -> list[dict]:
        events = []
        async with client.stream("POST", f"{gw}/v1/completions", json=completion(max_tokens=400, stream=True)) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line[6:]))
                if len(events) == 3:  # some tokens arrived: now the engine wedges
                    (await client.post(f"{sim}/sim/stall", json={"stalled": True})).raise_for_status()
        return events

    slow = EngineConfig(max_model_len=2048, step_overhead_s=0.02)  # a token every 20 ms: the stall lands mid-stream
    events, rows = asyncio.run(scenario(slow, 30.0, body))
    assert (
        "error" in events[-1] and "sent nothing for 1 s in the middle of its answer" in events[-1]["error"]["message"]
    )
    assert all("choices" in e for e in events[:-1]) and len(events) < 400
    assert len(rows) == 1 and rows[0]["outcome"] == "timeout" and "in the middle of its answer" in rows[0]["error"]


def test_an_answer_slower_than_the_whole_request_limit_is_cut_there() -> None:
    async def body(client: httpx.AsyncClient, gw: str, _sim: str) -> tuple:
        t0 = time.monotonic()
        slow = await client.post(f"{gw}/v1/completions", json=completion(max_tokens=200))
        return slow, time.monotonic() - t0

    # a token every 0.3 s: 200 take a minute; the whole-answer limit (0.8 s) runs out first
    crawl = EngineConfig(max_model_len=2048, step_overhead_s=0.3)
    (slow, waited), rows = asyncio.run(scenario(crawl, 0.8, body))
    assert slow.status_code == 504 and waited < 3
    assert "did not finish its answer within 0.8 s (upstream timeout)" in rows[0]["error"]
