"""Scale-event shipping: ``ScaleEvent`` rows -> JSON lines POSTed to the collector's ``/v1/events``.

In:  one ``ScaleEvent`` per decision or replica step (``add``), from the autoscaler's loop.
Out: batches POSTed every ``flush_s``; while the collector is away they wait in a bounded buffer
     (oldest dropped first past ``max_buffer``, counted in ``dropped``) and are retried with a
     backoff up to 30 s. ``add`` never waits: the loop is not held up by the collector. One flush
     at a time; ``flush`` at the end sends what is left. The pattern of the gateway's
     ``RequestLogShipper``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any

import httpx

from fleet.autoscale.events import ScaleEvent

__all__ = ["EventShipper"]

log = logging.getLogger("fleetscope.autoscale.shipper")
BATCH = 1000


class EventShipper:
    def __init__(self, url: str | None, flush_s: float = 1.0, max_buffer: int = 10_000) -> None:
        self.url = url
        self.flush_s = flush_s
        self.buffer: deque[dict[str, Any]] = deque(maxlen=max_buffer)
        self.dropped = 0
        self.shipped = 0
        self.refused: list[dict[str, Any]] = []  # the collector's reasons for lines it refused
        self._down = False
        self._flushing = asyncio.Lock()

    def add(self, event: ScaleEvent) -> None:
        if self.url is None:
            return
        if len(self.buffer) == self.buffer.maxlen:
            self.dropped += 1
        self.buffer.append(event.row())

    async def flush(self, client: httpx.AsyncClient) -> bool:
        """Ship what is buffered; False when the collector could not be reached."""
        async with self._flushing:
            while self.buffer and self.url:
                batch = [self.buffer[i] for i in range(min(BATCH, len(self.buffer)))]
                body = "\n".join(json.dumps(r) for r in batch) + "\n"
                try:
                    response = await client.post(
                        self.url, content=body, headers={"Content-Type": "application/x-ndjson"}, timeout=10
                    )
                    if response.status_code >= 500:
                        raise httpx.HTTPStatusError("server error", request=response.request, response=response)
                    answer = response.json()
                except (httpx.HTTPError, ValueError) as exc:
                    if not self._down:
                        log.warning("scale events: collector at %s unreachable (%s); buffering", self.url, exc)
                    self._down = True
                    return False
                if self._down:
                    log.info("scale events: collector reachable again")
                self._down = False
                for _ in batch:
                    self.buffer.popleft()
                rejected = answer.get("rejected", []) if isinstance(answer, dict) else []
                if rejected:
                    self.refused.extend(rejected)
                    log.error("scale events: collector refused %d line(s), first: %s", len(rejected), rejected[0])
                self.shipped += len(batch) - len(rejected)
            return True

    async def run(self, client: httpx.AsyncClient) -> None:
        delay = self.flush_s
        while True:
            await asyncio.sleep(delay)
            ok = await asyncio.shield(self.flush(client))
            delay = self.flush_s if ok else min(delay * 2, 30.0)
