"""Replicas that come and go at the gateway (its admin API), on simulated engines in real time:
a replica added is taken in once healthy; a draining replica finishes the stream it carries while
new requests go to the other; it cannot be removed while busy (409), and is once idle; the
gateway's request log has no request failed by any of it (rows as the collector parses them)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from aiohttp import web

from collector.requestlog import parse_request_log
from fleet.gateway.config import GatewaySpec
from fleet.gateway.routing import ReplicaState
from fleet.gateway.server import Gateway
from fleet.sim.engine import EngineConfig
from fleet.sim.server import SimFleet, SimReplica


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def completion(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": "tiny-small", "prompt": "hello " * 20, "max_tokens": max_tokens, "stream": stream}


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def with_fleet(body: Callable[[httpx.AsyncClient, str, dict[str, str]], Awaitable[Any]]) -> tuple[Any, list]:
    """Two simulated replicas (a token every 20 ms), a request-log intake and a gateway that
    starts with only the first: ``body(client, gateway url, replica urls)``."""
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
    config = EngineConfig(max_model_len=2048, step_overhead_s=0.02)
    sims = [SimReplica(f"small-{i}", "tiny-small", free_port(), config) for i in range(2)]
    fleet = SimFleet(sims)
    await fleet.start()
    urls = {s.name: f"http://127.0.0.1:{s.port}" for s in sims}
    spec = GatewaySpec(
        port=free_port(), request_log_url=f"http://127.0.0.1:{log_port}/v1/requests", request_log_flush_s=0.1
    )
    gateway = Gateway(spec, [ReplicaState("small-0", "tiny-small", urls["small-0"])])
    await gateway.start("127.0.0.1", spec.port)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            result = await body(client, f"http://127.0.0.1:{spec.port}", urls)
    finally:
        await gateway.stop()
        await fleet.stop()
        await runner.cleanup()
    rows, errors = parse_request_log("\n".join(received))
    assert errors == []
    return result, rows


async def replicas(client: httpx.AsyncClient, gw: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in (await client.get(f"{gw}/admin/replicas")).json()["replicas"]}


def test_a_draining_replica_finishes_its_stream_gets_nothing_new_and_leaves_once_idle() -> None:
    async def body(client: httpx.AsyncClient, gw: str, urls: dict[str, str]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        added = await client.post(
            f"{gw}/admin/replicas", json={"name": "small-1", "model": "tiny-small", "url": urls["small-1"]}
        )
        seen["added"] = (added.status_code, added.json()["healthy"])  # in once its probe passes, not before

        async def both_healthy() -> bool:
            return all(r["healthy"] for r in (await replicas(client, gw)).values())

        await until(both_healthy)
        seen["duplicate"] = (
            await client.post(
                f"{gw}/admin/replicas", json={"name": "small-1", "model": "tiny-small", "url": urls["small-1"]}
            )
        ).status_code
        texts: list[str] = []
        async with client.stream("POST", f"{gw}/v1/completions", json=completion(150, stream=True)) as stream:
            lines = stream.aiter_lines()
            async for line in lines:
                if line.startswith("data: {"):
                    texts.append(json.loads(line[6:])["choices"][0]["text"])
                    break
            busy = next(name for name, r in (await replicas(client, gw)).items() if r["in_flight"] == 1)
            other = "small-1" if busy == "small-0" else "small-0"
            drained = await client.post(f"{gw}/admin/replicas/{busy}/drain")
            seen["drained"] = drained.json()["draining"]
            seen["refused"] = await client.delete(f"{gw}/admin/replicas/{busy}")
            # new requests meanwhile: all to the other replica
            new = await asyncio.gather(
                *(client.post(f"{gw}/v1/completions", json=completion(4, stream=False)) for _ in range(4))
            )
            seen["new"] = [r.status_code for r in new]
            states = await replicas(client, gw)
            seen["firsts"] = {n: r["first_token_at"] for n, r in states.items()}
            seen["taken_in"] = {n: r["healthy_since"] for n, r in states.items()}
            async for line in lines:
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if chunk.get("choices"):
                        texts.append(chunk["choices"][0]["text"])
        seen["stream_chunks"] = len(texts)

        async def idle() -> bool:
            return (await replicas(client, gw))[busy]["in_flight"] == 0

        await until(idle)
        removed = await client.delete(f"{gw}/admin/replicas/{busy}")
        seen["removed"] = removed.status_code
        seen["left"] = sorted(await replicas(client, gw))
        seen["again"] = (await client.delete(f"{gw}/admin/replicas/{busy}")).status_code
        seen["after"] = (await client.post(f"{gw}/v1/completions", json=completion(4, stream=False))).status_code
        seen["busy"], seen["other"] = busy, other
        await asyncio.sleep(0.5)  # the request log's last batch
        return seen

    seen, rows = asyncio.run(with_fleet(body))
    busy, other = seen["busy"], seen["other"]
    assert seen["added"] == (201, False)
    assert seen["duplicate"] == 409
    assert seen["drained"] is True
    assert seen["refused"].status_code == 409 and "1 request(s) in flight" in seen["refused"].json()["error"]
    assert seen["new"] == [200] * 4
    assert seen["firsts"][other] is not None and seen["firsts"][busy] is not None  # first tokens stamped
    # each taken in (healthy) before its first token: what the autoscaler logs as `ready`, then `serving`
    assert all(seen["taken_in"][n] is not None and seen["taken_in"][n] <= seen["firsts"][n] for n in (busy, other))
    assert seen["stream_chunks"] >= 140  # the whole answer came through the drain (150 tokens)
    assert seen["removed"] == 200 and seen["left"] == [other] and seen["again"] == 404
    assert seen["after"] == 200
    assert len(rows) == 6 and {r["outcome"] for r in rows} == {"ok"}  # nothing failed by the drain
    streamed = [r for r in rows if r["stream"]]
    assert len(streamed) == 1 and streamed[0]["replica"] == busy and streamed[0]["completion_tokens"] == 150
    assert [r["replica"] for r in rows if not r["stream"]] == [other] * 5  # nothing new went to the draining one


def test_the_admin_api_refuses_bad_replicas_and_unknown_names() -> None:
    async def body(client: httpx.AsyncClient, gw: str, urls: dict[str, str]) -> list[int]:
        return [
            (await client.post(f"{gw}/admin/replicas", json={"name": "x"})).status_code,
            (
                await client.post(f"{gw}/admin/replicas", json={"name": "x", "model": "m", "url": "ftp://h:1"})
            ).status_code,
            (await client.post(f"{gw}/admin/replicas/nobody/drain")).status_code,
            (await client.delete(f"{gw}/admin/replicas/nobody")).status_code,
        ]

    codes, _rows = asyncio.run(with_fleet(body))
    assert codes == [400, 400, 404, 404]
