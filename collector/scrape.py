"""Scraper: ``Target``s -> ``ScrapeResult``s (parsed exposition, or the reason the scrape failed).

In:  targets (each with its own interval and timeout) and a callback that receives results.
Out: one ``ScrapeResult`` per target per interval: ``up``, ``duration_s``, ``samples``, ``error``
     and, when up, the parsed ``Exposition``. Any HTTP error, timeout, oversized body or parse
     error fails the whole scrape (no partial samples), as in Prometheus.

One asyncio task per target, started at a stable offset within its interval (so scrapes of
many targets spread out) and scheduled on absolute times (no drift). A slow or dead target only
ever delays itself: its timeout is <= its interval. Text format 0.0.4 is preferred in
``Accept`` (it has a cheaper parse and the same content) with OpenMetrics accepted; gzip is
accepted and decoded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from collector.exposition import Exposition, ExpositionError, SeriesCache, parse
from collector.targets import Target

__all__ = ["ACCEPT", "ScrapeResult", "Scraper", "scrape_once"]

ACCEPT = (
    "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,*/*;q=0.1"
)
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
log = logging.getLogger("fleetscope.scrape")


@dataclass(frozen=True)
class ScrapeResult:
    target: Target
    timestamp: float  # scrape start, seconds since the epoch
    up: bool
    duration_s: float
    samples: int
    error: str
    exposition: Exposition | None


async def scrape_once(
    client: aiohttp.ClientSession,
    target: Target,
    cache: SeriesCache | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> ScrapeResult:
    """Scrape one target now. Never raises for target problems: they become ``up=0``."""
    started = time.time()
    t0 = time.perf_counter()
    error = ""
    exposition: Exposition | None = None
    try:
        async with asyncio.timeout(target.timeout_s):
            async with client.get(target.url, headers={"Accept": ACCEPT}, allow_redirects=False) as response:
                if response.status != 200:
                    error = f"HTTP status {response.status}"
                else:
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in response.content.iter_chunked(1 << 16):  # decoded (gzip) bytes
                        size += len(chunk)
                        if size > max_body_bytes:
                            error = f"body larger than {max_body_bytes} bytes"
                            break
                        chunks.append(chunk)
                    if not error:
                        body = b"".join(chunks).decode("utf-8", errors="strict")
                        exposition = parse(body, response.headers.get("content-type"), cache)
    except TimeoutError:
        error = f"timeout after {target.timeout_s:g}s"
    except ExpositionError as exc:
        error = f"parse error: {exc}"
    except UnicodeDecodeError:
        error = "body is not UTF-8"
    except aiohttp.ClientConnectorError as exc:
        reason = getattr(exc.os_error, "strerror", None) or str(exc.os_error) or "failed"
        error = f"cannot connect: {reason}"
    except (aiohttp.ClientError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if error:
        exposition = None
    return ScrapeResult(
        target=target,
        timestamp=started,
        up=not error,
        duration_s=time.perf_counter() - t0,
        samples=len(exposition) if exposition is not None else 0,
        error=error[:500],
        exposition=exposition,
    )


class Scraper:
    """Runs one loop per target; ``set_targets`` adds and removes loops on the fly."""

    def __init__(
        self,
        sink: Callable[[ScrapeResult], Awaitable[None] | None],
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_connections: int = 512,
    ) -> None:
        self._sink = sink
        self._max_body = max_body_bytes
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._targets: dict[str, Target] = {}
        self._max_connections = max_connections
        self._client: aiohttp.ClientSession | None = None
        self.scrapes = 0
        self.failures = 0
        self.missed = 0  # intervals skipped because the loop fell behind

    @property
    def targets(self) -> list[Target]:
        return list(self._targets.values())

    def set_targets(self, targets: list[Target]) -> None:
        if self._client is None:  # created inside the running event loop
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ttl_dns_cache=300),
                headers={"User-Agent": "fleetscope-collector"},
            )
        wanted = {t.key: t for t in targets}
        for key in list(self._tasks):
            if key not in wanted or wanted[key] != self._targets[key]:
                self._tasks.pop(key).cancel()
                self._targets.pop(key, None)
        for key, target in wanted.items():
            if key not in self._tasks:
                self._targets[key] = target
                self._tasks[key] = asyncio.create_task(self._loop(target), name=f"scrape {key}")

    async def _loop(self, target: Target) -> None:
        cache = SeriesCache()
        loop = asyncio.get_running_loop()
        interval = target.interval_s
        # first scrape at the target's stable offset within the interval
        start = loop.time()
        next_at = start + target.offset()
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            assert self._client is not None
            result = await scrape_once(self._client, target, cache, self._max_body)
            self.scrapes += 1
            if not result.up:
                self.failures += 1
            try:
                outcome = self._sink(result)
                if outcome is not None:
                    await outcome
            except Exception:
                log.exception("result of %s could not be handled", target.url)
            next_at += interval
            now = loop.time()
            if now > next_at:  # fell behind: skip the intervals we cannot make up
                skipped = int((now - next_at) // interval) + 1
                self.missed += skipped
                next_at += skipped * interval

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
        if self._client is not None:
            await self._client.close()
