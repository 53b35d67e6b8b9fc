"""Request-log shipping: gateway records -> JSON lines POSTed to the collector's ``/v1/requests``.

In:  one dict per finished request (``add``), from the gateway's event loop.
Out: batches POSTed every ``flush_s``. While the collector is down, records wait in a bounded
     buffer (oldest dropped first past ``max_buffer``, counted in
     ``fleetscope_gateway_request_log_dropped_total``) and are retried with backoff. One flush
     at a time, and a flush under way finishes even when the periodic task is cancelled (the
     gateway stopping): the final flush then sends what is left, never a batch twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["RequestLogShipper"]

log = logging.getLogger("fleetscope.gateway.requestlog")
BATCH = 5000


class RequestLogShipper:
    def __init__(self, url: str | None, flush_s: float, max_buffer: int, registry: CollectorRegistry) -> None:
        self.url = url
        self.flush_s = flush_s
        self.buffer: deque[dict[str, Any]] = deque(maxlen=max_buffer)
        self.dropped = Counter(
            "fleetscope_gateway_request_log_dropped_total",
            "Request-log records dropped: buffer full",
            registry=registry,
        )
        self.shipped = Counter(
            "fleetscope_gateway_request_log_shipped_total",
            "Request-log records accepted by the collector",
            registry=registry,
        )
        self.refused = Counter(
            "fleetscope_gateway_request_log_refused_total",
            "Request-log records the collector refused",
            registry=registry,
        )
        Gauge("fleetscope_gateway_request_log_buffered", "Request-log records waiting", registry=registry).set_function(
            lambda: len(self.buffer)
        )
        self._down = False
        self._flushing = asyncio.Lock()

    def add(self, record: dict[str, Any]) -> None:
        if self.url is None:
            return
        if len(self.buffer) == self.buffer.maxlen:
            self.dropped.inc()
        self.buffer.append(record)

    async def flush(self, session: aiohttp.ClientSession) -> bool:
        """Ship what is buffered; False when the collector could not be reached."""
        async with self._flushing:
            return await self._ship(session)

    async def _ship(self, session: aiohttp.ClientSession) -> bool:
        while self.buffer and self.url:
            batch = [self.buffer[i] for i in range(min(BATCH, len(self.buffer)))]
            body = "\n".join(json.dumps(r) for r in batch) + "\n"
            try:
                async with session.post(
                    self.url,
                    data=body,
                    headers={"Content-Type": "application/x-ndjson"},
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as response:
                    answer = await response.json(content_type=None)
                    if response.status >= 500:
                        raise aiohttp.ClientResponseError(response.request_info, (), status=response.status)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                if not self._down:
                    log.warning("request log: collector at %s unreachable (%s); buffering", self.url, exc)
                self._down = True
                return False
            if self._down:
                log.info("request log: collector reachable again")
            self._down = False
            for _ in batch:
                self.buffer.popleft()
            rejected = answer.get("rejected", []) if isinstance(answer, dict) else []
            if rejected:
                self.refused.inc(len(rejected))
                log.error("request log: collector refused %d record(s), first: %s", len(rejected), rejected[0])
            self.shipped.inc(len(batch) - len(rejected))
        return True

    async def run(self, session: aiohttp.ClientSession) -> None:
        delay = self.flush_s
        while True:
            await asyncio.sleep(delay)
            # shielded: cancelled mid-POST, the batch the collector may already hold would stay
            # buffered and go again with the final flush
            ok = await asyncio.shield(self.flush(session))
            delay = self.flush_s if ok else min(delay * 2, 30.0)
