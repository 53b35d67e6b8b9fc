"""The gateway sheds by queue time, for real: in front of a replica that serves one request at a
time (a first token every 0.25 s), a burst of requests past what the model's TTFT budget allows
is refused at once with 429 and a Retry-After, the admitted ones answer within about the budget,
and the request log and the gateway's metrics say why (shed_queue_time); with queue-time
admission off, the same burst is admitted whole and waits."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
from aiohttp import web

from collector.requestlog import parse_request_log
from fleet.gateway.config import GatewaySpec, QueueTimeSpec
from fleet.gateway.routing import ReplicaState
from fleet.gateway.server import Gateway

SERVICE_S = 0.25  # each request's turn at the serial replica
BUDGET_S = 1.0  # tiny-small's TTFT target: about 4 requests' worth of queue


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serial_replica() -> tuple[web.AppRunner, str]:
    lock = asyncio.Lock()

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        async with lock:  # FIFO, one at a time
            await asyncio.sleep(SERVICE_S)
        return web.json_response(
            {
                "id": "x",
                "choices": [{"text": "ok", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 1},
            }
        )

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _burst(queue_time: bool) -> tuple[list[tuple[int, float, str | None]], list[dict[str, Any]], str]:
    received: list[str] = []

    async def intake(request: web.Request) -> web.Response:
        lines = [line for line in (await request.text()).splitlines() if line]
        received.extend(lines)
        return web.json_response({"accepted": len(lines), "kept": len(lines), "rejected": []})

    log_app = web.Application()
    log_app.router.add_post("/v1/requests", intake)
    log_runner = web.AppRunner(log_app)
    await log_runner.setup()
    log_port = free_port()
    await web.TCPSite(log_runner, "127.0.0.1", log_port).start()
    replica_runner, url = await _serial_replica()
    spec = GatewaySpec(
        port=free_port(),
        request_log_url=f"http://127.0.0.1:{log_port}/v1/requests",
        request_log_flush_s=0.1,
        queue_time=QueueTimeSpec(enabled=queue_time, min_events=4, window_s=10),
    )
    gateway = Gateway(spec, [ReplicaState("small-0", "tiny-small", url)], budgets={"tiny-small": BUDGET_S})
    await gateway.start("127.0.0.1", spec.port)
    gw = f"http://127.0.0.1:{spec.port}"
    body = {"model": "tiny-small", "prompt": "hello", "max_tokens": 1}
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(6):  # the pool's pace: a first token every 0.25 s
                assert (
                    await client.post(f"{gw}/v1/completions", json=body, headers={"x-tenant": "warm"})
                ).status_code == 200

            async def one(i: int) -> tuple[int, float, str | None]:
                await asyncio.sleep(i * 0.01)  # in order
                t0 = time.perf_counter()
                r = await client.post(f"{gw}/v1/completions", json=body, headers={"x-tenant": "acme"})
                return r.status_code, time.perf_counter() - t0, r.headers.get("retry-after")

            answers = await asyncio.gather(*(one(i) for i in range(20)))
            metrics = (await client.get(f"{gw}/metrics")).text
        await asyncio.sleep(0.3)  # the request log's last flush
    finally:
        await gateway.stop()
        await replica_runner.cleanup()
        await log_runner.cleanup()
    rows, errors = parse_request_log("\n".join(received))
    assert errors == []
    return list(answers), [r for r in rows if r["tenant"] == "acme"], metrics


def test_a_burst_past_the_budget_is_shed_at_once_and_the_admitted_answer_in_time() -> None:
    answers, rows, metrics = asyncio.run(_burst(queue_time=True))
    admitted = [a for a in answers if a[0] == 200]
    shed = [a for a in answers if a[0] == 429]
    assert len(admitted) + len(shed) == 20
    # about budget / service time of them fit (4-5 with the estimate's pace); the rest are refused
    assert 3 <= len(admitted) <= 7, answers
    assert all(seconds < 0.2 for _s, seconds, _r in shed)  # refused at once, not after waiting
    assert all(retry is not None and int(retry) >= 1 for _s, _t, retry in shed)
    assert max(seconds for _s, seconds, _r in admitted) < 1.5 * BUDGET_S + SERVICE_S
    outcomes = [r["outcome"] for r in rows]
    assert outcomes.count("shed_queue_time") == len(shed) and outcomes.count("ok") == len(admitted)
    assert all("past its 1.0s budget" in r["error"] for r in rows if r["outcome"] == "shed_queue_time")
    assert f'fleetscope_gateway_rejected_total{{reason="queue_time"}} {float(len(shed))}' in metrics


def test_without_queue_time_admission_the_burst_waits_in_line() -> None:
    answers, rows, _metrics = asyncio.run(_burst(queue_time=False))
    assert [a[0] for a in answers] == [200] * 20
    assert max(seconds for _s, seconds, _r in answers) > 4.0  # the last waited for the 19 before it
    assert {r["outcome"] for r in rows} == {"ok"}
