"""The collector's remote-write endpoint: ``POST /api/v1/write`` -> the writer, with the answers senders act on.

In:  HTTP requests from Prometheus, vmagent ... (their body read by the collector's body reader,
     which refuses what is too large or does not inflate), the ``RemoteWriteConverter``.
Out: rows handed to the ``Writer``; 204 when kept, 4xx with the reason for a body that will never
     be good (the sender drops it), 503 while the writer's spool is nearly full (the sender keeps
     the samples and retries); the collector's counters, and the newest sample time per job.

Decoding and converting run off the event loop (a large request takes a while), one request at a
time: the converter's per-series state is not shared between threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from collector.convert import Batch
from collector.otlp import OtlpError
from collector.own_metrics import CollectorMetrics
from collector.remote_write import RemoteWriteConverter, RemoteWriteError, WriteCounts, decode
from collector.writer import Writer

__all__ = ["RemoteWriteReceiver"]

log = logging.getLogger("fleetscope.collector")


class RemoteWriteReceiver:
    def __init__(
        self,
        converter: RemoteWriteConverter,
        writer: Writer,
        metrics: CollectorMetrics,
        read_body: Callable[[web.Request], Awaitable[bytes]],
        renamed: dict[str, str],
    ) -> None:
        self.converter = converter
        self.writer = writer
        self.metrics = metrics
        self._read_body = read_body
        self._renamed = renamed  # old vLLM names seen -> new ones (the collector's, shown to users)
        self._lock = threading.Lock()
        self.newest: dict[str, float] = {}  # job -> the newest sample time a sender delivered

    def _convert(self, body: bytes, headers: Mapping[str, str]) -> tuple[Batch, WriteCounts]:
        with self._lock:
            message = decode(body, headers, self.converter.config.max_decoded_bytes)
            return self.converter.convert(message)

    async def handle(self, request: web.Request) -> web.Response:
        """204 when kept, 4xx with the reason for a body that will never be good, 503 while the
        spool is nearly full (the sender retries)."""
        if not self.writer.has_room():
            self.metrics.remote_write.labels("busy").inc()
            return web.Response(status=503, text="the store is away and the spool is nearly full: retry later\n")
        try:
            body = await self._read_body(request)  # read even when refused: aiohttp would read it afterwards
            batch, counts = await asyncio.to_thread(self._convert, body, request.headers)
        except (RemoteWriteError, OtlpError) as exc:
            status = exc.status if isinstance(exc, RemoteWriteError) else 400
            self.metrics.remote_write.labels("refused").inc()
            self.metrics.bad_bodies.labels("remote_write").inc()
            log.warning("remote-write body refused (%d): %s", status, exc)
            return web.Response(status=status, text=f"{exc}\n")
        self._renamed.update(self.converter.renamed)
        if batch.tables:
            self.writer.add_tables(batch.tables)
        self._count(counts)
        return web.Response(status=204)

    def _count(self, counts: WriteCounts) -> None:
        self.metrics.remote_write.labels("ok").inc()
        for job, newest in counts.newest.items():
            if newest > self.newest.get(job, 0.0):  # never back (a late shard's batch)
                self.newest[job] = newest
                self.metrics.remote_newest.labels(job).set(newest)
        for result, n in (("kept", counts.samples), ("scrape", counts.scrapes), *counts.dropped().items()):
            if n:
                self.metrics.remote_samples.labels(result).inc(n)
