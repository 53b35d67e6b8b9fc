"""Wiring of the collector: ``Settings`` (+ fleet spec) -> a running ``Collector``.

In:  settings (collector section, ClickHouse URL, data_dir, fleet spec path; the ``exporter``
     section, the metadata URL and the cost weights for fleetscope's numbers on ``/metrics``).
Out: ``build_collector`` returns the collector with its writer and client, ready to start, with
     fleetscope's numbers registered on its ``/metrics`` (``mount_exporter``: the ``exporter``
     package's figures, refreshed in a thread of their own while its HTTP server runs, on a
     ClickHouse handle of their own); ``run_collector`` runs it until SIGINT/SIGTERM and flushes
     on the way out.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from collector.convert import load_prior
from collector.events import mount as mount_events
from collector.remote_write import RemoteWriteConfig
from collector.service import Collector, CollectorConfig
from collector.targets import FileDiscovery, Shard, Target, make_target
from collector.writer import Writer, WriterConfig
from exporter.expose import register
from exporter.read import Stores
from exporter.refresh import Refresher
from fleetscope.settings import Settings

__all__ = ["build_collector", "fleet_targets", "mount_exporter", "run_collector", "static_targets"]

log = logging.getLogger("fleetscope.collect")
GATEWAY_SCRAPE_S = 15.0  # a third-party gateway's own /metrics: every 15 s, 14 s to answer


def fleet_targets(settings: Settings, spec_path: Path | None = None) -> list[Target]:
    """One ``vllm`` target per replica of the fleet spec, and a ``gateway`` one for a third-party
    gateway's own metrics (missing spec: none, with a warning)."""
    from fleet.spec import load_spec

    path = spec_path or settings.fleet.spec
    if not Path(path).exists():
        log.warning("fleet spec %s not found: no fleet targets", path)
        return []
    spec = load_spec(Path(path))
    c = settings.collector
    from fleet.gateways import metrics_url, third_party

    gateway = metrics_url(spec)
    extra = (
        [
            make_target(
                gateway,
                job="gateway",
                labels={"gateway": str(third_party(spec))},
                # a gateway's counters need no 5 s resolution, and LiteLLM's /metrics/ takes seconds to
                # answer beside busy engines (1.7 s on average, often over 4 s, on 2 cores)
                interval_s=max(c.scrape_interval_s, GATEWAY_SCRAPE_S),
                timeout_s=max(c.scrape_timeout_s, GATEWAY_SCRAPE_S - 1),
            )
        ]
        if gateway
        else []
    )
    return extra + [
        make_target(
            f"{spec.host}:{r.port}",
            job="vllm",
            labels={"replica": r.name, "model": r.model, "gpu_type": r.gpu_type, "gpu_count": str(r.gpu_count)},
            interval_s=c.scrape_interval_s,
            timeout_s=c.scrape_timeout_s,
        )
        for r in spec.replicas
    ]


def autoscale_discovery(settings: Settings) -> list[FileDiscovery]:
    """The autoscaler's replicas: a ``file_sd`` targets file it writes in the fleet's state directory
    (``job: vllm``, labelled as ``fleet_targets`` labels the spec's), created empty when missing;
    none when the spec does not autoscale."""
    from fleet.autoscale.actuator import TARGETS_FILE
    from fleet.spec import load_spec

    path = Path(settings.fleet.spec)
    if not path.exists():
        return []
    scale = load_spec(path).autoscale
    if scale is None or not scale.enabled:
        return []
    targets = settings.data_dir / "fleet" / TARGETS_FILE
    if not targets.exists():
        targets.parent.mkdir(parents=True, exist_ok=True)
        targets.write_text("[]\n")
    c = settings.collector
    return [FileDiscovery(targets, "vllm", c.scrape_interval_s, c.scrape_timeout_s)]


def static_targets(settings: Settings) -> list[Target]:
    c = settings.collector
    out = []
    for group in c.static_targets:
        interval = group.interval_s or c.scrape_interval_s
        timeout = group.timeout_s or min(c.scrape_timeout_s, interval)
        for address in group.targets:
            out.append(make_target(address, job=group.job, labels=group.labels, interval_s=interval, timeout_s=timeout))
    return out


def build_collector(
    settings: Settings,
    client: Any,
    *,
    extra_targets: list[Target] | None = None,
    exporter_stores: Callable[[], Stores] | None = None,
) -> Collector:
    """The collector of ``settings`` on ``client``; ``exporter_stores`` opens what fleetscope's
    numbers are read from (default: a ClickHouse handle and the metadata DB of ``settings``)."""
    c = settings.collector
    targets = (
        static_targets(settings) + (fleet_targets(settings) if c.fleet_targets else []) + list(extra_targets or [])
    )
    discoveries = [
        FileDiscovery(
            f.path,
            f.job,
            f.interval_s or c.scrape_interval_s,
            f.timeout_s or min(c.scrape_timeout_s, f.interval_s or c.scrape_interval_s),
        )
        for f in c.file_sd
    ]
    discoveries += autoscale_discovery(settings)
    registry = CollectorRegistry()
    writer = Writer(
        client,
        WriterConfig(
            spool_dir=settings.data_dir / "spool",
            batch_rows=c.batch_rows,
            flush_interval_s=c.flush_interval_s,
            spool_max_bytes=c.spool_max_bytes,
        ),
        registry=registry,
    )
    config = CollectorConfig(
        host=c.listen_host,
        http_port=c.otlp_http_port,
        grpc_port=c.otlp_grpc_port,
        static_targets=targets,
        file_sd=discoveries,
        max_body_bytes=c.max_body_bytes,
        sampling=c.sampling,
        otlp_decode=c.otlp_decode,
        shard=Shard(c.shard_index, c.shard_count),  # this collector's hashmod share of the targets
        request_mappings=list(c.request_mappings),
        shipped_mappings=tuple(c.shipped_mappings),
        remote_write=RemoteWriteConfig(tuple(c.remote_write.replica_labels), c.remote_write.max_decoded_bytes),
    )
    try:
        config.prior = load_prior(client)
    except Exception as exc:  # noqa: BLE001 - a store that is away must not stop the collector
        log.warning(
            "could not read the last sample values from ClickHouse (%s): the first counter "
            "increase of each series after this start is counted from its next sample",
            exc,
        )
    collector = Collector(config, writer, registry)
    from fleetscope.queryapi import mount_endpoint

    # `fleetscope sql` reaches the store this process holds through it
    collector.notes = [  # type: ignore[attr-defined]
        mount_endpoint(settings, collector),
        mount_exporter(settings, collector, exporter_stores),
        mount_events(collector),
    ]
    return collector


def exporter_stores(settings: Settings) -> Callable[[], Stores]:
    """Opens the figures' stores: a ClickHouse handle of their own (a handle serialises its calls:
    the writer's inserts do not wait behind a refresh) and the metadata DB (prices, SLO targets)."""

    def open_stores() -> Stores:
        from fleetscope.stores import open_clickhouse
        from storage.metadata import make_engine, make_sessionmaker

        handle = open_clickhouse(settings)
        engine = make_engine(settings.metadata.url)

        def close() -> None:
            handle.close()
            engine.dispose()

        return Stores(handle, make_sessionmaker(engine), close)

    return open_stores


def mount_exporter(settings: Settings, collector: Collector, stores: Callable[[], Stores] | None = None) -> str:
    """fleetscope's numbers on the collector's ``/metrics``: registered on its registry, refreshed
    from when its HTTP server starts to when it stops (on shard 0 only, when collectors share the
    targets); a line saying so, or why not."""
    e, c = settings.exporter, settings.collector
    if not e.enabled:
        return "fleetscope's numbers are not on /metrics (exporter.enabled: false)"
    if c.shard_index != 0:  # every shard reads the same store: one serves the numbers, not N times the queries
        return f"fleetscope's numbers are on shard 0's /metrics (this is shard {c.shard_index} of {c.shard_count})"
    refresher = Refresher(
        stores or exporter_stores(settings), e.params(settings.cost.weights()), interval_s=e.interval_s
    )
    register(collector.registry, refresher)

    async def start(_app: web.Application) -> None:
        refresher.start()

    async def stop(_app: web.Application) -> None:
        await asyncio.to_thread(refresher.stop)

    def hooks(app: web.Application) -> None:
        app.on_startup.append(start)
        app.on_cleanup.append(stop)

    collector.mounts.append(hooks)
    return (
        f"fleetscope's numbers at http://{c.listen_host}:{c.otlp_http_port}/metrics: read every "
        f"{e.interval_s:g}s over the last {e.window_s:g}s (stalls, draft acceptance: {e.recent_window_s:g}s)"
    )


async def run_collector(collector: Collector, progress: Callable[[str], None]) -> bool:
    """Run until SIGINT/SIGTERM; returns True when everything was flushed to ClickHouse."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await collector.start()
    c = collector.config
    progress(
        f"collecting: {len(collector.targets())} target(s); OTLP http://{c.host}:{c.http_port}/v1/traces"
        + (f", gRPC {c.host}:{c.grpc_port}" if c.grpc_port else "")
        + f"; gateway logs POST /v1/requests; remote-write POST /api/v1/write; /metrics http://{c.host}:{c.http_port}/metrics"
    )
    for note in getattr(collector, "notes", []):
        progress(note)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=10)
        except TimeoutError:
            s = collector.scraper
            count, size = collector.writer.spool_size()
            progress(
                f"scrapes {s.scrapes if s else 0} (failed {s.failures if s else 0}, missed {s.missed if s else 0}); "
                f"spool {count} batch(es) {size} B"
            )
    progress("stopping: flushing the writer")
    return await collector.stop()
