"""Local HTTP scrape targets with chosen misbehaviour (real aiohttp servers on loopback)."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path

from aiohttp import web

from collector.targets import make_target

VLLM = (Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt").read_text()


class Targets:
    """Local HTTP targets with chosen misbehaviour (real servers on loopback)."""

    def __init__(self) -> None:
        self.counter = 100.0
        self.hits: dict[str, int] = {}
        app = web.Application()
        app.router.add_get("/{kind}/metrics", self.handle)
        self.app = app

    async def handle(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        self.hits[kind] = self.hits.get(kind, 0) + 1
        if kind == "good":
            body = VLLM.encode()
            if "gzip" in request.headers.get("Accept-Encoding", ""):
                return web.Response(
                    body=gzip.compress(body),
                    headers={"Content-Encoding": "gzip", "Content-Type": "text/plain; version=0.0.4"},
                )
            return web.Response(body=body, content_type="text/plain")
        if kind == "slow":
            await asyncio.sleep(2)
            return web.Response(text=VLLM)
        if kind == "error":
            return web.Response(status=500, text="engine exploded")
        if kind == "garbage":
            return web.Response(text="<html>this is not an exposition</html>\n")
        if kind == "huge":
            return web.Response(text="x 1\n" * 200_000)
        if kind == "counter":  # an engine restart in the middle: the counter drops to 3
            hit = self.hits[kind]
            value = [100, 150, 3, 10][min(hit - 1, 3)]
            return web.Response(
                text=f'# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{model_name="m"}} {value}\n'
            )
        return web.Response(status=404)

    async def __aenter__(self) -> Targets:
        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()

    def target(self, kind: str, interval_s: float = 1.0, timeout_s: float = 0.5, **kw):
        return make_target(
            f"http://127.0.0.1:{self.port}/{kind}/metrics",
            job="test",
            labels={"replica": kind},
            interval_s=interval_s,
            timeout_s=timeout_s,
            **kw,
        )
